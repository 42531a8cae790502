"""llmgw: a self-hosted LLM gateway and fleet control plane."""

__version__ = "0.1.0"

# The link protocol version an agent sends in register.  Raise it when a
# field's meaning changes; adding an optional field does not need it.
PROTOCOL_VERSION = 1
