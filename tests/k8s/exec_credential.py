#!/usr/bin/env python3
"""A real exec credential plugin for tests, and the kubeconfig that uses it.

    python exec_credential.py TOKEN_FILE RUNS_LOG [EXPIRES_IN_SECONDS]

prints an ExecCredential (client.authentication.k8s.io/v1beta1) whose bearer token is the content
of TOKEN_FILE, as `aws eks get-token` or `gke-gcloud-auth-plugin` print theirs; with
EXPIRES_IN_SECONDS, an `expirationTimestamp` that far ahead. Each run appends one line to RUNS_LOG
(the `KUBERNETES_EXEC_INFO` the client passed), so a test can count the runs. A TOKEN_FILE that
cannot be read is exit status 1 and a line on stderr, as a plugin that cannot log in.

`exec_kubeconfig(...)` writes a kubeconfig whose user is this plugin.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

API_VERSION = "client.authentication.k8s.io/v1beta1"


def exec_kubeconfig(path: Path, server: str, token_file: Path, runs_log: Path, *, ca_file: Path | None = None,
                    ca_data: str | None = None, expires_in: float | None = None) -> Path:
    """A kubeconfig for `server` whose credentials come from running this file (JSON is YAML)."""
    cluster: dict[str, Any] = {"server": server}
    if ca_file is not None:
        cluster["certificate-authority"] = str(ca_file)
    if ca_data is not None:
        cluster["certificate-authority-data"] = ca_data
    args = [str(Path(__file__).resolve()), str(token_file), str(runs_log)]
    if expires_in is not None:
        args.append(str(expires_in))
    doc = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"exec": {"apiVersion": API_VERSION, "command": sys.executable, "args": args,
                                                  "interactiveMode": "Never"}}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(doc, indent=1))
    path.chmod(0o600)
    return path


def runs(runs_log: Path) -> int:
    """How many times the plugin ran."""
    try:
        return len(runs_log.read_text().splitlines())
    except FileNotFoundError:
        return 0


def main(argv: list[str]) -> int:
    token_file, runs_log = Path(argv[1]), Path(argv[2])
    with runs_log.open("a") as log:
        log.write(os.environ.get("KUBERNETES_EXEC_INFO", "{}") + "\n")
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        print(f"cannot log in: {exc}", file=sys.stderr)
        return 1
    status: dict[str, Any] = {"token": token}
    if len(argv) > 3:
        expiry = datetime.now(UTC) + timedelta(seconds=float(argv[3]))
        status["expirationTimestamp"] = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
    print(json.dumps({"apiVersion": API_VERSION, "kind": "ExecCredential", "status": status}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
