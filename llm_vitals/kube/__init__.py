"""The one Kubernetes layer: the only package that talks to the API server (kubernetes-asyncio).

    connect.py   the client constructor: a KubeAccess (llm_vitals/config.py): kubeconfig (exec plugins), or the service account
    client.py    KubeClient: one request in, JSON or a KubeError out; watches as event streams
    errors.py    KubeConfigError, KubeUnavailable, ApiError and `api_error`, the one reader of an error answer
    objects.py   the calls the project makes: list/watch (pods, replicasets, nodes), pods, evictions, Events, nodes
    leases.py    LeaseTransport: read, create and replace a Lease (False on 409), each answer dated by the server
    evictions.py PodRemover, the one eviction path: evict or delete by pod UID (in turn, for several), the Eviction
                 API in the version the server serves (found once), and what each answer means
    informer.py  list, watch, resume, relist on 410 with backoff; `next_step` is its pure rule
    backoff.py   the backoff schedule and the watch timeout, client-go's numbers
"""
