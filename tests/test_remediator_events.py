"""The name of a refusal's Event on a pod: one per pod, refusal and alert, whichever replica writes it."""

from __future__ import annotations

import re

import pytest

from llm_vitals.remediator.pods import refusal_event_name

# Kubernetes' DNS-1123 subdomain (an Event's name): at most 253 characters.
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
KEY = ("fp1", 1_800_000_000.123)
BASE = refusal_event_name("vllm-0", "uid-1", "gpu_fault", KEY)


@pytest.mark.parametrize("pod, uid, reason, key, same", [
    ("vllm-0", "uid-1", "gpu_fault", KEY, True),  # the other replica, or this one after a restart
    ("vllm-0", "uid-2", "gpu_fault", KEY, False),  # the pod recreated under its name
    ("vllm-0", None, "gpu_fault", KEY, False),
    ("vllm-0", "uid-1", "circuit_open", KEY, False),
    ("vllm-0", "uid-1", "gpu_fault", ("fp2", KEY[1]), False),  # another alert
    ("vllm-0", "uid-1", "gpu_fault", ("fp1", KEY[1] + 600), False),  # its next firing episode
    ("vllm-1", "uid-1", "gpu_fault", KEY, False),
], ids=["same", "new uid", "no uid", "other reason", "other alert", "next episode", "other pod"])
def test_one_name_per_pod_refusal_and_alert(pod, uid, reason, key, same):
    assert (refusal_event_name(pod, uid, reason, key) == BASE) is same


@pytest.mark.parametrize("pod, expected_prefix", [
    ("vllm-0", "vllm-0."),
    ("a" * 253, "a" * 225 + "."),  # 253 in all with the 28 characters of the suffix
    ("a" * 224 + "-b" * 14, "a" * 224 + "."),  # cut after a '-': dropped, the name still ends alphanumeric
    ("a" * 224 + ".b" * 14, "a" * 224 + "."),
], ids=["short", "longest pod name", "cut on a dash", "cut on a dot"])
def test_the_name_is_a_valid_event_name(pod, expected_prefix):
    name = refusal_event_name(pod, "uid-1", "fleet_gate", KEY)
    assert name.startswith(expected_prefix) and re.fullmatch(r".*\.llm-vitals-[0-9a-f]{16}", name), name
    assert len(name) <= 253 and SUBDOMAIN.fullmatch(name), name
