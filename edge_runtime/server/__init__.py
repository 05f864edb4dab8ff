"""The inference server: KServe v2 / Open Inference Protocol over aiohttp.

``edge-runtime serve`` runs ``daemon.main``; ``app.create_app`` builds the
application for embedding and tests. Importing this package imports neither
aiohttp nor prometheus-client; its modules do.
"""
