# Sourced by tools/real-k8s-setup.sh and tools/real-kubelet-setup.sh, which build their parts of
# Kubernetes from the same Debian source package with the same fix; the caches stay theirs.
#
# kubernetes_source VERSION: in the current directory, Debian's source of `kubernetes` VERSION
# fetched (the deb-src entries the k8s setup adds), unpacked into ./kubernetes and entered, with
# the vendored reflect2 replaced by Debian's.
kubernetes_source() {
  local version=$1 R=vendor/github.com/modern-go/reflect2
  nice -n 10 apt-get source --download-only "kubernetes=$version*" || nice -n 10 apt-get source --download-only kubernetes
  nice -n 10 dpkg-source -x kubernetes_*.dsc kubernetes
  cd kubernetes
  head -1 debian/changelog | grep -q "$version" || { echo "expected kubernetes $version, got: $(head -1 debian/changelog)"; exit 1; }
  # Kubernetes 1.20 vendors github.com/modern-go/reflect2 v1.0.1, which breaks under Go >= 1.18:
  # the apiserver panics (nil pointer in reflect2.Type2) on some requests, e.g. POST
  # /api/v1/namespaces, intermittently. Debian's 1.0.2 is the API-compatible Go 1.18 fix
  # (golang-github-modern-go-reflect2-dev).
  rm -rf "$R" && mkdir -p "$R"
  cp -a /usr/share/gocode/src/github.com/modern-go/reflect2/. "$R/"
}
