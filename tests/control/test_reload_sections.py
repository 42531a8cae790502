"""A reload's summary names every key it changed, and says which wait for a restart.

Adding ``pki:`` reloaded as "no changes", though the next ``ctl onboard``
signed with it: only listen/tls, fleet, engines and models were compared.
These reload the whole server process built in this reactor (as SIGHUP and
``ctl reload`` do), and the last one a real llmgw-server through a real
``llmgw ctl reload``.
"""

from __future__ import annotations

import pytest

from llmgw.config.server import load_server_config
from llmgw.control.catalog import Catalog
from llmgw.control.reload import reload_all
from tests.control.test_reload import MODELS, NEW_KEY, OLD_KEY, server  # noqa: F401 (a fixture)
from tests.ctl.test_identity import details
from tests.support.cluster import cluster  # noqa: F401 (a fixture)


def test_adding_pki_shows_in_the_summary_and_signs_from_then_on(server, pki):  # noqa: F811
    assert server.control.identity.onboarding(details=details())["signs"] is False
    server.write(OLD_KEY + MODELS + f"pki: {{ca_dir: {pki}}}\n")
    outcome = server.control.reload()
    assert outcome.refused is None
    assert outcome.changes == ("pki.ca_dir changed",)
    assert server.control.identity.onboarding(details=details())["signs"] is True
    # And taking it away again is a change too.
    server.write(OLD_KEY + MODELS)
    assert server.control.reload().changes == ("pki.ca_dir changed",)
    assert server.control.identity.onboarding(details=details())["signs"] is False


SPARE = MODELS.replace("profiles:\n", "profiles:\n  spare: {engine: sim}\n")


@pytest.mark.parametrize("text, said", [
    # What a reload applies: the router's, the admin page's, the control plane's own.
    (NEW_KEY + MODELS, "router.scoring, router.keys changed"),
    (OLD_KEY + MODELS + "admin: {max_rows: 7}\n", "admin.max_rows changed"),
    (OLD_KEY + MODELS + "fleet: {downloads_per_node: 3}\n", "fleet.downloads_per_node changed"),
    (OLD_KEY + SPARE, "profiles.spare changed"),
    # What the server reads only when it starts.
    (OLD_KEY + MODELS + "link: {max_connections: 100}\n", "link.max_connections changed: it takes effect when the server restarts"),
    (OLD_KEY + MODELS + "fleet: {settle_s: 9, lost_after_s: 200}\n",
     "fleet.lost_after_s, fleet.settle_s changed: they take effect when the server restarts"),
    (OLD_KEY + MODELS + "admin: {on_api: false}\n", "admin.on_api changed: it takes effect when the server restarts"),
], ids=lambda value: value.split(" changed")[0] if " changed" in value else "")
def test_every_section_that_changed_is_in_the_summary(server, text, said):  # noqa: F811
    server.write(text)
    outcome = server.control.reload()
    assert outcome.refused is None
    assert outcome.changes == (said,)


def test_a_change_the_reload_applies_and_one_it_cannot_are_told_apart(server):  # noqa: F811
    server.write(OLD_KEY + MODELS + "fleet: {downloads_per_node: 3, settle_s: 9}\n")
    assert server.control.reload().changes == (
        "fleet.downloads_per_node changed", "fleet.settle_s changed: it takes effect when the server restarts")
    assert server.control.session.fleet.downloads_per_node == 3


def test_a_router_section_without_an_api_says_what_it_waits_for(tmp_path, pki):
    path = tmp_path / "server.yaml"
    head = (f'listen: {{link: "ssl:0:interface=127.0.0.1"}}\n'
            f"tls: {{ca: {pki}/ca.crt, cert: {pki}/llmgw-server.crt, key: {pki}/llmgw-server.key}}\n")
    path.write_text(head + OLD_KEY + MODELS)
    catalog = Catalog(load_server_config(path))
    path.write_text(head + NEW_KEY + MODELS)
    # No router listener: nothing in this server applies router:.
    changes = reload_all(catalog, []).changes
    assert changes == (
        "router.scoring changed: nothing in this server uses it yet; it waits for a restart with listen.api set",
        "router.keys changed: nothing in this server uses it yet; it waits for a restart with listen.api set",
    )


@pytest.mark.integration
def test_ctl_reload_of_a_real_server_names_the_pki_it_added(cluster):  # noqa: F811
    """A relative ca_dir, as tls.* beside it: the summary names it, and the server signs from then on."""
    config = cluster.write_server_config()
    cluster.start_server()
    before = cluster.ctl("reload")
    assert before.returncode == 0 and before.stdout.strip() == "reloaded: no changes", before.stdout + before.stderr
    config.write_text(config.read_text() + "pki: {ca_dir: pki}\n")
    after = cluster.ctl("reload")
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == "reloaded: pki.ca_dir changed"


def test_every_section_of_server_yaml_is_applied_by_a_reload_or_waits_for_a_restart(server):  # noqa: F811
    """A section added later that no part applies would read "nothing in this server uses it": say which it is."""
    import attrs

    from llmgw.config.server import ServerConfig
    from llmgw.control import sections

    applied = [key for listener in server.control.session.reload_listeners for key in listener.applies]
    known = (*sections.AT_START, *sections.APPLIED_BY_CONTROL, *applied)
    unknown = [field.name for field in attrs.fields(ServerConfig) if field.name != "path"
               and not any(rule == field.name or rule.startswith(field.name + ".") for rule in known)]
    assert unknown == []
    assert {"router", "admin", "tls.crl"} <= set(applied)
