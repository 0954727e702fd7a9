"""The HTTP/REST ingress: KServe v2 plus Triton's extensions, on falcon ASGI + uvicorn.

Modules, one concern each:

* ``codec``: inference request parsing and response building (transport-free)
* ``json_tensors``: tensor ``data`` as JSON, both ways
* ``compression``: gzip/deflate request and response bodies
* ``body``: reading a request body under a size limit
* ``errors``: the one error renderer (``{"error": msg}``)
* ``app``: ``build_app(ctx)``, the falcon routes
* ``server``: ``serve(...)``, uvicorn on a SO_REUSEPORT socket with graceful drain
"""
