{{/* The base name of every object: the release's name when it already says llm-vitals. */}}
{{- define "llm-vitals.fullname" -}}
{{- if contains "llm-vitals" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-llm-vitals" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "llm-vitals.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Labels on every object: the recommended ones, then additionalLabels. */}}
{{- define "llm-vitals.labels" -}}
app.kubernetes.io/part-of: llm-vitals
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A component's selector: stable across upgrades, so never the version. `job` in Prometheus is
     the Service's app.kubernetes.io/name (the ServiceMonitors' jobLabel): the rules watch job="llm-vitals". */}}
{{- define "llm-vitals.selector" -}}
app.kubernetes.io/name: llm-vitals
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "llm-vitals.vllmSelector" -}}
app.kubernetes.io/name: vllm
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The security context of every llm-vitals container: the image's fixed non-root uid. */}}
{{- define "llm-vitals.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "llm-vitals.exporterUrl" -}}
{{- printf "http://%s:9471" (include "llm-vitals.fullname" .) -}}
{{- end -}}

{{- define "llm-vitals.remediatorUrl" -}}
{{- printf "http://%s-remediator:9472" (include "llm-vitals.fullname" .) -}}
{{- end -}}

{{/* The probe shim of a server pod: a native sidecar (an initContainer, 1.29+) or a classic one. */}}
{{- define "llm-vitals.shimContainer" -}}
- name: vitals-shim
  image: {{ include "llm-vitals.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if eq .Values.shim.sidecar "native" }}
  # A native sidecar: starts before the server and stops after it, so it answers the preStop drain.
  restartPolicy: Always
  {{- end }}
  command: ["llm-vitals-exporter", "--config", "/etc/llm-vitals/exporter.yaml"]
  ports:
    - {name: vitals, containerPort: 9471}
  {{- if eq .Values.shim.sidecar "native" }}
  # Only a startup probe: the server waits for the shim, so its own startup probe is not refused.
  # No liveness probe: restarting the shim would not fix a stuck server.
  startupProbe:
    httpGet: {path: /healthz, port: vitals}
    periodSeconds: 2
    failureThreshold: 30
  {{- else }}
  # Outlives the server's preStop (drain + 15 s) so it can answer the drain; shorter than the grace period.
  lifecycle:
    preStop:
      exec:
        command: ["python3", "-c", "import time; time.sleep(20)"]
  {{- end }}
  resources:
    {{- toYaml .Values.shim.resources | nindent 4 }}
  securityContext:
    {{- include "llm-vitals.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - {name: shim-config, mountPath: /etc/llm-vitals/exporter.yaml, subPath: exporter.yaml, readOnly: true}
    - {name: tokens, mountPath: /etc/llm-vitals/tokens, readOnly: true}
{{- end -}}
