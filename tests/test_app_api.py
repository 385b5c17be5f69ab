"""The app served in-process and driven through its public API with gradio_client."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
from gradio_client import Client  # noqa: E402

import app  # noqa: E402
from mulo.config import knob_table  # noqa: E402
from mulo.tracefile import parse
from mulo.ui.files import DISPLAY  # noqa: E402
from tests.helpers import worker_port  # noqa: E402


@pytest.fixture(scope="module")
def client():
    demo = app.build_demo().queue(max_size=64)
    _, url, _ = demo.launch(
        prevent_thread_lock=True, server_name="127.0.0.1", server_port=worker_port(7872), quiet=True, **app.LAUNCH_KW
    )
    c = Client(url, verbose=False)
    yield c
    c.close()
    demo.close()


def test_only_generate_is_public_and_documented(client):
    api = client.view_api(return_format="dict", print_info=False)
    assert list(api["named_endpoints"]) == ["/generate"] and not api["unnamed_endpoints"]
    params = api["named_endpoints"]["/generate"]["parameters"]
    names = [p["parameter_name"] for p in params]
    assert names[:2] == ["prompt", "seed"] and {"tau", "r", "k", "radius", "cfg", "third"} <= set(names)
    assert all(p["parameter_has_default"] for p in params)


def test_generate_streams_and_returns_both_images_and_traces(client):
    job = client.submit("red apple", 5, "toy", api_name="/generate")
    updates = list(job)
    assert len(updates) >= 3
    out = job.result()
    img_ar, img_mulo, img_third, md_ar, md_mulo, md_third, json_ar, json_mulo, files, progress_line = out
    # the Rounds panel's line follows the runs while they stream (the final update leaves it)
    assert any("**MuLo-SD** finished" in str(update[9]) for update in updates)
    assert Image.open(img_ar).size == Image.open(img_mulo).size == (DISPLAY, DISPLAY)
    assert img_third is None and md_third == ""
    assert parse(json_ar).method == "ar" and parse(json_mulo).method == "mulo"
    assert parse(json_mulo).seed == 5 and len(files) == 2


def test_bad_input_is_an_error_and_the_next_request_works(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="prompt must not be empty"):
        client.predict("   ", 0, "toy", api_name="/generate")
    with pytest.raises(AppError, match="k must be an integer"):
        client.predict("red apple", 0, "toy", k=2.5, api_name="/generate")
    with pytest.raises(AppError, match=r"top_k must be an integer in \[0, 128\] \(got 600\)"):
        client.predict("red apple", 0, "toy", top_k=600, api_name="/generate")
    out = client.predict("red apple", 1, "toy", api_name="/generate")
    assert parse(out[7]).method == "mulo"


def test_a_cancelled_request_leaves_the_engine_usable(client):
    job = client.submit("red apple", 2, "toy", "sjd", api_name="/generate")
    job.cancel()
    out = client.predict("red apple", 2, "toy", api_name="/generate")
    assert parse(out[6]).method == "ar"


@pytest.mark.slow  # 24 requests: ~40 s
def test_eight_concurrent_clients_three_requests_each(client):
    url = client.src

    def user(i):
        own = Client(url, verbose=False)
        seen = []
        for j in range(3):
            out = own.predict("red apple", 10 * i + j, "toy", api_name="/generate")
            seen.append((parse(out[6]).seed, parse(out[7]).seed, Image.open(out[1]).size))
        own.close()
        return seen

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(user, range(8)))
    for i, seen in enumerate(results):
        assert [s[:2] for s in seen] == [(10 * i + j, 10 * i + j) for j in range(3)]
        assert all(s[2] == (DISPLAY, DISPLAY) for s in seen)


def _error(client, *args, **kwargs) -> str:
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as info:
        client.predict(*args, api_name="/generate", **kwargs)
    return str(info.value)


def _raw(client, data: list) -> str:
    """POST /generate over plain HTTP (JSON as Python writes it: NaN, lone surrogates escaped);
    returns the event stream's text."""
    import json
    import urllib.request

    url = client.src.rstrip("/")
    request = urllib.request.Request(
        f"{url}/gradio_api/call/generate", data=json.dumps({"data": data}).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    event = json.loads(urllib.request.urlopen(request, timeout=30).read())["event_id"]
    return urllib.request.urlopen(f"{url}/gradio_api/call/generate/{event}", timeout=120).read().decode()


def test_seeds_are_exact_integers_below_2_pow_63(client):
    for seed in (2**62, 2**62 + 12345, 2**63 - 1, str(2**53 + 1)):
        out = client.predict("red apple", seed, "toy", api_name="/generate")
        assert parse(out[6]).seed == int(seed)
    for seed in (2**63, -1, 10**400, "abc", "5.5", 1.5, True):
        assert "seed must be an integer in [0, 2^63)" in _error(client, "red apple", seed, "toy")
    assert "seed is required" in _error(client, "red apple", "", "toy")
    assert "seed must be an integer in [0, 2^63) (got nan)" in _raw(client, ["red apple", float("nan"), "toy"])


@pytest.mark.parametrize(
    ("knob", "value", "message"),
    [
        ("tau", -1, "tau must be a number in [0, 1.01] (got -1)"),
        ("tau", "5", "tau must be a number in [0, 1.01] (got '5')"),
        ("radius", 10**400, "radius must be an integer in [0, 64] (got 1000000000000000000000000000000000000..."),
        ("k", 2.5, "k must be an integer in [0, 127] (got 2.5)"),
        ("cfg", True, "cfg must be a number in [0, 20] (got True)"),
        ("r", "2", "r must be one of 2, 4 (the family's drafter ratios) (got '2')"),
        ("drafting", 3, "drafting must be one of sequential, zipar (got 3)"),
        (
            "third",
            "eagle",
            "third method must be one of none, zipar, sjd, sd, lantern, eagle2, mc-sjd, gsd (got 'eagle')",
        ),
    ],
)
def test_every_knob_error_names_the_knob_and_its_range(client, knob, value, message):
    assert message in _error(client, "red apple", 0, "toy", **{knob: value})


def test_the_api_documents_the_types_it_accepts(client):
    params = {
        p["parameter_name"]: p
        for p in client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]
    }
    assert params["r"]["type"] == {"type": "integer", "enum": [2, 4]}
    assert params["tau"]["type"]["type"] == "number" and params["radius"]["type"]["type"] == "integer"
    assert params["tau"]["type"]["maximum"] == 1.01
    assert {t["type"] for t in params["seed"]["type"]["anyOf"]} == {"integer", "string"}
    out = client.predict("red apple", 3, "toy", r=4, tau=0.5, radius=2, api_name="/generate")
    assert parse(out[7]).config["r"] == 4


def test_prompts_are_validated_with_what_was_dropped(client):
    stream = _raw(client, ["red \ud800", 0, "toy"])
    assert "prompt is not valid text (an unpaired surrogate at character 4)" in stream, stream
    out = client.predict("one two three four five", 0, "toy", api_name="/generate")
    assert parse(out[7]).warnings == ["only the first 4 words are used (dropped: five)"]
    assert "only the first 4 words are used" in out[4]


@pytest.mark.slow  # ~25 s
def test_raw_http_with_only_the_required_inputs_and_monitoring(client):
    import urllib.error
    import urllib.request

    wanted = 4 + len(knob_table())  # prompt, seed, family, third, then every knob
    assert f"/generate needs at least prompt and seed (got 0 of {wanted} inputs)" in _raw(client, [])
    assert "event: complete" in _raw(client, ["red apple", 7])  # every other input: the family's value
    nan_tau = _raw(client, ["red apple", 0, "toy", "none", None, float("nan")])  # r, then tau
    assert "tau must be a number in [0, 1.01] (got nan)" in nan_tau, nan_tau
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{client.src.rstrip('/')}/monitoring/summary", timeout=30)
    assert info.value.code in (403, 404)
