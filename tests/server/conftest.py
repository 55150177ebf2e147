"""Shared fixtures: the running server (started by run.sh) and the binary under test."""

import os

import httpx
import openai
import pytest

BASE = os.environ.get("NIWAKI_BASE_URL", "http://127.0.0.1:8080")


@pytest.fixture(scope="session")
def base_url():
    return BASE


@pytest.fixture(scope="session")
def client():
    return openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http():
    with httpx.Client(base_url=BASE, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def model_id(client):
    return client.models.list().data[0].id


def metric(http, name, labels=None):
    """Sum of a Prometheus sample's values (those matching every label given)."""
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        rest = head[len(name):]
        if rest and not rest.startswith("{"):
            continue
        if labels and not all(f'{k}="{v}"' in rest for k, v in labels.items()):
            continue
        total += float(value)
    return total
