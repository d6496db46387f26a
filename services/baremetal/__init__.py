"""The bare-metal provisioning systems capibus carries besides Azimuth.

Each provider is a service of its own (``metalstack``, and later the OpenShift Assisted
providers), with the anatomy of every capibus service; they share nothing but ``shared/``.
"""
