"""The app served in-process and driven through its public API with gradio_client."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
from gradio_client import Client  # noqa: E402

import app  # noqa: E402
from mulo.trace import Trace  # noqa: E402


@pytest.fixture(scope="module")
def client():
    demo = app.build_demo().queue(max_size=64)
    _, url, _ = demo.launch(
        prevent_thread_lock=True, server_name="127.0.0.1", server_port=7872, quiet=True, **app.LAUNCH_KW
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
    img_ar, img_mulo, img_third, md_ar, md_mulo, md_third, json_ar, json_mulo, files = out
    assert Image.open(img_ar).size == Image.open(img_mulo).size == (app.DISPLAY, app.DISPLAY)
    assert img_third is None and md_third == ""
    assert Trace.from_dict(json_ar).method == "ar" and Trace.from_dict(json_mulo).method == "mulo"
    assert Trace.from_dict(json_mulo).seed == 5 and len(files) == 2


def test_bad_input_is_an_error_and_the_next_request_works(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="prompt must not be empty"):
        client.predict("   ", 0, "toy", api_name="/generate")
    with pytest.raises(AppError, match="k must be an integer"):
        client.predict("red apple", 0, "toy", k=2.5, api_name="/generate")
    with pytest.raises(AppError, match="greater than maximum"):
        client.predict("red apple", 0, "toy", top_k=600, api_name="/generate")
    out = client.predict("red apple", 1, "toy", api_name="/generate")
    assert Trace.from_dict(out[7]).method == "mulo"


def test_a_cancelled_request_leaves_the_engine_usable(client):
    job = client.submit("red apple", 2, "toy", "sjd", api_name="/generate")
    job.cancel()
    out = client.predict("red apple", 2, "toy", api_name="/generate")
    assert Trace.from_dict(out[6]).method == "ar"


def test_eight_concurrent_clients_three_requests_each(client):
    url = client.src

    def user(i):
        own = Client(url, verbose=False)
        seen = []
        for j in range(3):
            out = own.predict("red apple", 10 * i + j, "toy", api_name="/generate")
            seen.append((Trace.from_dict(out[6]).seed, Trace.from_dict(out[7]).seed, Image.open(out[1]).size))
        own.close()
        return seen

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(user, range(8)))
    for i, seen in enumerate(results):
        assert [s[:2] for s in seen] == [(10 * i + j, 10 * i + j) for j in range(3)]
        assert all(s[2] == (app.DISPLAY, app.DISPLAY) for s in seen)
