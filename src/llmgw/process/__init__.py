"""Each process composed in one place: the services, listeners and sessions it holds.

``server``, ``agent`` and ``router`` are the modules the twistd plugins name
(``twistd llmgw-server|llmgw-agent|llmgw-router``); ``common`` is what the
three share.  This is the one package that imports both ``control`` and
``router``: they do not import each other.
"""
