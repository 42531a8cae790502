"""The admin listener (``/metrics``, ``/healthz``, the admin page) that the server and the router process both serve."""
