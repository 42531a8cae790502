"""Several servers, one leader: the etcd client, the election with its epochs, and the servers' list in etcd.

With server.yaml's ``ha:`` several servers share one etcd.  One *leads*: it
holds the key ``/llmgw/leader`` under its lease (``llmgw.ha.election``); the
others stand by.  The **epoch** is that key's ``create_revision``, which etcd
makes grow with every new leader, never a counter llmgw keeps.  Each server
also lists itself under ``/llmgw/servers/`` (``llmgw.ha.servers``).

The package imports no process's package: ``control/``, ``router/``,
``agent/``, ``admin/`` and ``process/`` import it.
"""
