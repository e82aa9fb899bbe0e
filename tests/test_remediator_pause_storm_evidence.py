"""Pause, storm cooldown, target templates and evidence, end to end on loopback in the
single-replica mode (the replicated mode runs the same gate on the real API server: tests/k8s/)."""

from __future__ import annotations

import sys

import pytest
from test_remediator_helpers import AUTH, OLD_PROCESS, alert_payload, target_json
from test_remediator_webhook import actions, exporter, metric, post, remediator, restarter  # noqa: F401

PY = sys.executable


async def test_pause_refuses_everything_until_deleted_and_is_shown(remediator, restarter):  # noqa: F811
    client = await remediator()
    until = client.clock.now + 3600
    assert (await client.post("/api/v1/pause", json={"until": until, "reason": "x"})).status == 401
    response = await client.post("/api/v1/pause", json={"until": until, "reason": "GPU driver upgrade"}, headers=AUTH)
    assert response.status == 200
    assert await response.json() == {"paused": True, "until": until, "reason": "GPU driver upgrade"}
    assert await metric(client, "llm_vitals_remediator_paused") == 1
    status, body = await post(client, alert_payload("a"))
    assert status == 200
    assert body["decisions"][0] | {"detail": ""} == {"target": "a", "fingerprint": "ae4ddf2da96a7112",
                                                     "decision": "paused", "reason": "paused", "detail": ""}
    assert "GPU driver upgrade" in body["decisions"][0]["detail"]
    await client.service.wait_idle()
    assert restarter.calls == 0
    assert await metric(client, 'llm_vitals_remediator_decisions_total{reason="paused",target="a"}') == 1
    assert (await client.delete("/api/v1/pause")).status == 401
    response = await client.delete("/api/v1/pause", headers=AUTH)
    assert (await response.json())["paused"] is False
    assert await metric(client, "llm_vitals_remediator_paused") == 0
    # A paused decision did not decide the alert: its redelivery restarts now.
    status, body = await post(client, alert_payload("a"))
    assert body["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    assert restarter.calls == 1
    words = [row["decision"] for row in await actions(client)]
    assert words == ["restart", "unpause", "paused", "pause"]


async def test_a_pause_ends_by_itself_at_its_until(remediator, restarter):  # noqa: F811
    client = await remediator()
    until = "2026-12-02T15:00:00Z"  # 1796223600: after the test clock's now
    response = await client.post("/api/v1/pause", json={"until": until, "reason": "window"}, headers=AUTH)
    assert response.status == 200 and (await response.json())["until"] == 1796223600.0
    assert (await post(client, alert_payload("a")))[1]["decisions"][0]["reason"] == "paused"
    client.clock.now = 1796223600.0
    assert (await (await client.get("/api/v1/pause", headers=AUTH)).json())["paused"] is False
    assert (await post(client, alert_payload("a")))[1]["decisions"][0]["reason"] == "allowed"


@pytest.mark.parametrize("body, message", [
    ({"until": 1, "reason": "x"}, "until: must be in the future"),
    ({"until": "tomorrow", "reason": "x"}, "until: not an RFC 3339 time: 'tomorrow'"),
    ({"until": "2030-01-01T00:00:00", "reason": "x"}, "until: give a time zone (Z or +01:00)"),
    ({"until": 2e9}, "reason: a non-empty text of at most 500 characters is required"),
    ({"until": 2e9, "reason": " "}, "reason: a non-empty text of at most 500 characters is required"),
    ({"until": True, "reason": "x"}, "until: an RFC 3339 time or unix seconds is required"),
    ({"until": 2e9, "reason": "x", "by": "me"}, 'expected {"until": TIME, "reason": TEXT}'),
    ([], 'expected {"until": TIME, "reason": TEXT}'),
])
async def test_a_bad_pause_gets_422_with_its_reason(remediator, body, message):  # noqa: F811
    client = await remediator()
    response = await client.post("/api/v1/pause", json=body, headers=AUTH)
    assert response.status == 422 and (await response.json())["error"] == message


async def test_pause_survives_a_restart_of_the_remediator(remediator, tmp_path):  # noqa: F811
    client = await remediator()
    await client.post("/api/v1/pause", json={"until": client.clock.now + 60, "reason": "r"}, headers=AUTH)
    await client.close()
    again = await remediator()
    assert (await (await again.get("/api/v1/pause", headers=AUTH)).json())["reason"] == "r"


async def test_after_a_storm_no_restart_until_the_fleet_was_healthy_for_storm_cooldown(
    remediator, restarter, exporter  # noqa: F811
):
    client = await remediator(storm_cooldown="10m", exporter_max_age=0)
    for name in "bc":
        exporter.targets[name] = target_json(name, "stuck")
    status, body = await post(client, alert_payload("a"))
    assert body["decisions"][0]["reason"] == "fleet_gate"
    # The storm passes: only a is still stuck, the others are healthy again.
    for name in "bc":
        exporter.targets[name] = target_json(name, "idle")
    client.clock.advance(60)
    status, body = await post(client, alert_payload("a", fingerprint="f2"))
    assert (status, body["decisions"][0]["reason"]) == (200, "storm_cooldown")
    assert "540s" in body["decisions"][0]["detail"]
    client.clock.advance(539)
    assert (await post(client, alert_payload("a", fingerprint="f3")))[1]["decisions"][0]["reason"] == "storm_cooldown"
    client.clock.advance(1)
    assert (await post(client, alert_payload("a", fingerprint="f4")))[1]["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    assert restarter.calls == 1
    assert await metric(client, 'llm_vitals_remediator_decisions_total{reason="storm_cooldown",target="a"}') == 2


async def test_a_storm_seen_again_extends_the_storm_cooldown(remediator, restarter, exporter):  # noqa: F811
    client = await remediator(storm_cooldown="10m", exporter_max_age=0)
    exporter.targets |= {n: target_json(n, "stuck") for n in "bc"}
    await post(client, alert_payload("a"))
    client.clock.advance(500)
    assert (await post(client, alert_payload("a", fingerprint="f2")))[1]["decisions"][0]["reason"] == "fleet_gate"
    exporter.targets |= {n: target_json(n, "idle") for n in "bc"}
    client.clock.advance(200)  # 700 s after the first storm, 200 s after the last sight of it
    assert (await post(client, alert_payload("a", fingerprint="f3")))[1]["decisions"][0]["reason"] == "storm_cooldown"


async def test_the_journal_keeps_the_exporters_target_and_the_pre_restart_output(
    remediator, restarter, exporter  # noqa: F811
):
    script = "import sys; print('stack of', sys.argv[1]); print('x' * 5000)"
    targets = {name: {"executor": "http", "url": restarter.url, "timeout": "5s"} for name in "abcde"}
    targets["a"]["pre_restart"] = {"argv": [PY, "-c", script, "{name}"], "timeout": "10s", "output_limit": 100}
    client = await remediator(targets=targets)
    await post(client, alert_payload("a"))
    await client.service.wait_idle()
    assert restarter.calls == 1
    [row] = await actions(client)
    response = await client.get(f"/api/v1/actions/{row['id']}", headers=AUTH)
    assert response.status == 200
    found = await response.json()
    assert found["evidence"] == exporter.targets["a"]
    pre = found["pre_restart"]
    assert pre["argv"][-1] == "a" and pre["result"] == "ok"
    assert pre["output"].startswith("stack of a\nxxx") and pre["output"].endswith("more bytes]")
    assert len(pre["output"].split("...")[0]) == 100
    assert (found["result"], found["decision"]) == ("ok", "restart")


async def test_a_slow_pre_restart_is_cut_at_its_timeout_and_the_restart_still_runs(
    remediator, restarter  # noqa: F811
):
    targets = {name: {"executor": "http", "url": restarter.url, "timeout": "5s"} for name in "abcde"}
    targets["a"]["pre_restart"] = {"argv": [PY, "-c", "import time; time.sleep(30)"], "timeout": "300ms"}
    client = await remediator(targets=targets)
    await post(client, alert_payload("a"))
    await client.service.wait_idle()
    assert restarter.calls == 1
    [row] = await actions(client)
    found = await (await client.get(f"/api/v1/actions/{row['id']}", headers=AUTH)).json()
    assert found["pre_restart"]["result"] == "timeout" and found["pre_restart"]["duration_seconds"] < 10


async def test_refusals_keep_the_evidence_too_and_unknown_actions_are_404(remediator, exporter):  # noqa: F811
    client = await remediator()
    exporter.targets["a"] = target_json("a", "busy")
    await post(client, alert_payload("a"))
    [row] = await actions(client)
    found = await (await client.get(f"/api/v1/actions/{row['id']}", headers=AUTH)).json()
    assert found["evidence"]["state"] == "busy"
    assert (await client.get("/api/v1/actions/999", headers=AUTH)).status == 404
    assert (await client.get("/api/v1/actions/x", headers=AUTH)).status == 400


def _pod_target(name: str, namespace: str, state: str = "stuck", **over):
    return target_json(name, state, namespace=namespace, pod=name.split("/")[-1], pod_uid="uid-" + name,
                       node="node-a", **over)


@pytest.fixture
def kubeconfig(tmp_path):
    """A kubeconfig naming an API server that is not there (the dry run never calls it)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:9', "
        "insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n"
        "- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
    )
    return str(path)


async def test_templates_take_the_exporters_targets_by_engine_namespace_and_name(
    remediator, exporter, kubeconfig  # noqa: F811
):
    exporter.targets["llm/vllm-0"] = _pod_target("llm/vllm-0", "llm")
    exporter.targets["dev/vllm-0"] = _pod_target("dev/vllm-0", "dev")
    exporter.targets["llm/tgi-0"] = _pod_target("llm/tgi-0", "llm", engine="tgi")
    client = await remediator(
        dry_run=True,
        kubernetes={"kubeconfig": kubeconfig},
        target_templates=[{"match": {"namespace": "llm", "engine": "vllm", "name": "llm/vllm-*"},
                           "executor": "kubernetes"}],
    )
    reasons = {}
    for i, name in enumerate(["llm/vllm-0", "dev/vllm-0", "llm/tgi-0", "llm/nothing", "a"]):
        _, body = await post(client, alert_payload(name, fingerprint=f"f{i}"))
        reasons[name] = body["decisions"][0]["reason"]
    # The template takes llm/vllm-0; its dry run checks the pod with the API server as a live run would
    # (the kubeconfig's is not there: unverified, never a "would restart" on a pod nobody confirmed).
    assert reasons == {"llm/vllm-0": "identity_unverified", "dev/vllm-0": "unknown_target",
                       "llm/tgi-0": "unknown_target", "llm/nothing": "unknown_target", "a": "dry_run"}
    assert await metric(
        client, 'llm_vitals_remediator_decisions_total{reason="identity_unverified",target="llm/vllm-0"}') == 1
    assert await metric(client, 'llm_vitals_remediator_decisions_total{reason="unknown_target",target="(unknown)"}') == 3


async def test_gpu_fault_on_a_template_target_is_refused_by_default(remediator, exporter, kubeconfig):  # noqa: F811
    exporter.targets["llm/vllm-0"] = _pod_target("llm/vllm-0", "llm", gpu_fault=True)
    client = await remediator(kubernetes={"kubeconfig": kubeconfig},
                              target_templates=[{"match": {"namespace": "llm"}, "executor": "kubernetes"}])
    _, body = await post(client, alert_payload("llm/vllm-0"))
    assert body["decisions"][0]["reason"] == "gpu_fault"
    # The Event for it goes to an API server that is not there: logged, the answer is unaffected.
    await client.service.wait_idle()
    assert OLD_PROCESS  # the target is old enough: only the GPU fault refused it
