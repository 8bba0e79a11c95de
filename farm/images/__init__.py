"""Container images as task environments: the registry client, pulls, and unprivileged unpacking.

- ``reference``: image names as docker reads them;
- ``auth``: registry credentials as docker keeps them;
- ``registry``: the registry v2 API (manifests, blobs: resumable, checked) on aiohttp;
- ``manifest``: manifests, indexes, configs (OCI and Docker schema 2);
- ``pull``: a name to its manifest and config (pull policy), its layers' blobs;
- ``unpack``: one layer into a plain directory, whiteouts as deleted paths.

The layers live in the environment store (``farm.envs.image``: one record per layer, shared
between images, under ``envs.max_size_bytes``); a sandbox runs on them as its root
(``farm.sandboxes.views``, ``farm.sandboxes.hostrt``).
"""
