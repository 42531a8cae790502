"""What every test directory shares; import it as ``tests.support.<module>``.

- ``wait``: waiting on a positive condition, named, with a deadline, from a
  plain test (``wait_for``), a reactor test (``until``; ``until_awaited`` when
  looking must itself wait, as for a page) or an asyncio test (``until_async``).
- ``net``: free ports, and just enough HTTP/1.1 over raw sockets.
- ``sim``: the simulator as a real process, and its fixtures.
- ``cluster``: a real server, agents and ``llmgw ctl`` on 127.0.0.1.
- ``modelfile``: one model file served over HTTP from a thread, with a gate
  that holds the download open part-way until the test has looked.
- ``hfmirror``: a Hugging Face hub mirror as a real process, holding a
  download open the same way.
- ``reportedfleet``: a fleet of two nodes as real agents report them, with
  its ``clock`` and ``fleet`` fixtures, for the collector and admin tests.
- ``routerproc``: a real ``llmgw-router`` process in front of static engines.
- ``toolengine``: a stand-in engine that calls tools and writes JSON schemas,
  and sends llama-server's own CORS field.
- ``surface``: a router in front of both.
- ``engineproc``: a real engine started from its adapter's own command line.
- ``nodeclient`` (with ``node/``): the official Node ``openai`` client, pinned.
- ``openapi_hooks``: schemathesis's hooks for OpenAI's Responses operations.
"""
