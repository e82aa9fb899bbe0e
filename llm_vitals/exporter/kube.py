"""The exporter's Kubernetes API client (kubernetes-asyncio): one constructor for the node watch and pod discovery.

A kubeconfig when one is given (tests, out-of-cluster runs), else the in-cluster service account
(its token is re-read as it rotates by kubernetes-asyncio's in-cluster loader). A config that
cannot be used is a KubeConfigError with a sentence, never a traceback in a loop.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException


class KubeConfigError(Exception):
    """The kubeconfig or the in-cluster service account cannot be used."""


async def api_client(kubeconfig: Path | None) -> client.ApiClient:
    """An ApiClient for `kubeconfig`, or for the pod's service account when None."""
    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
        where = f"the kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise KubeConfigError(f"cannot use {where}: {type(exc).__name__}: {exc}") from None
    return client.ApiClient(configuration)
