"""The link: the hub (an embedded WAMP router), its clients, and the URIs between them."""
