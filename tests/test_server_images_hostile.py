"""Images built to be slow to decode, against a real uvicorn server on 127.0.0.1: a progressive JPEG of
thousands of tiny scans (each a pass over the whole image) is refused from its markers with one sentence,
the decoder never runs, and the queue places it would have held stay free for everyone else; a request
whose images put it over the prompt-token cap is refused from the image headers, before any decode."""

from __future__ import annotations

import base64
import io
import threading

import pytest
from PIL import Image

from qvl_agent.errors import ImageError
from qvl_agent.image import load_image, load_image_bytes
from qvl_agent.image_limits import jpeg_layout
from tests.conftest import run_cli
from tests.test_server_hostile import AUTH, png_url, post, responsive, serve, user


def progressive_jpeg(size: int = 1000, extra_scans: int = 0) -> bytes:
    """A flat progressive JPEG (Pillow's 10-scan script) with its last refinement scan, 14 bytes, repeated
    `extra_scans` times: libjpeg accepts the repeats, and each one is a pass over every block."""
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (120, 130, 140)).save(buf, "JPEG", progressive=True, quality=90)
    data = buf.getvalue()
    last_scan = data[data.rfind(b"\xff\xda") : -2]
    return data[:-2] + last_scan * extra_scans + b"\xff\xd9"


def jpeg_url(data: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(data).decode()


@pytest.fixture()
def decodes(monkeypatch) -> list[str]:
    """Every call of the server's image decoder, in order."""
    from qvl_agent.server import images as images_module

    calls: list[str] = []
    real = images_module.load_image_bytes
    monkeypatch.setattr(
        images_module, "load_image_bytes", lambda data, **kw: calls.append("decode") or real(data, **kw)
    )
    return calls


def test_scans_and_segments_are_counted_from_the_markers_alone():
    assert jpeg_layout(progressive_jpeg(64)) == (10, 25)
    assert jpeg_layout(progressive_jpeg(64, 500))[0] == 101  # counting stops past the limit
    assert jpeg_layout(progressive_jpeg(64, 50), max_scans=1_000)[0] == 60
    baseline = io.BytesIO()
    # Scan markers inside a segment's payload (an EXIF thumbnail) are skipped with the segment.
    Image.new("RGB", (64, 64)).save(baseline, "JPEG", exif=b"Exif\x00\x00" + b"\xff\xda\x00\x02" * 200)
    assert jpeg_layout(baseline.getvalue())[0] == 1
    comments = baseline.getvalue()[:2] + b"\xff\xfe\x00\x02" * 250_000 + baseline.getvalue()[2:]
    assert jpeg_layout(comments)[1] == 1_001  # a megabyte of empty comments: the walk stops early
    assert jpeg_layout(b"\x89PNG\r\n\x1a\n") == (0, 0)


def test_a_progressive_jpeg_of_thousands_of_scans_is_refused_undecoded_and_holds_no_queue_place(decodes):
    hostile = {"messages": [user("what is this?", jpeg_url(progressive_jpeg(1000, 2_000)))]}
    results: dict[int, object] = {}

    def send(n):
        results[n] = post(serve_url, hostile)

    # Two places in the queue, two hostile requests at once (as in the report): were they decoded, they
    # would hold both places and the ordinary request that follows would get 429.
    with serve(max_queue=2) as serve_url:
        threads = [threading.Thread(target=send, args=(n,), daemon=True) for n in range(2)]
        for t in threads:
            t.start()
        responsive(serve_url)
        for t in threads:
            t.join(120)
        responsive(serve_url)
    for r in results.values():
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_image"
        assert error["message"].startswith("The image is a progressive JPEG of more than 100 scans")
        assert error["message"].count(". ") == 0  # one sentence
    assert len(results) == 2
    assert decodes == []  # refused from its markers: the decoder never ran


def test_an_ordinary_progressive_jpeg_is_still_answered(decodes):
    with serve() as url:
        r = post(url, {"messages": [user("what is this?", jpeg_url(progressive_jpeg(640)))]})
    assert r.status_code == 200, r.text
    assert decodes == ["decode"]


def test_images_over_the_prompt_token_cap_are_refused_from_their_headers_before_any_decode(decodes):
    # 1000x1000 is 976 visual tokens: over a cap of 500 whatever the text.
    with serve(max_prompt_tokens=500) as url:
        r = post(url, {"messages": [user("x", png_url(1000, 1000))]}, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        ok = post(url, {"messages": [user("x", png_url(200, 200))]})
        assert ok.status_code == 200, ok.text
    assert decodes == ["decode"]  # only the request within the cap


def test_a_megabyte_of_empty_jpeg_comments_is_refused_before_pillow_walks_them(decodes):
    base = progressive_jpeg(64)
    with serve() as url:
        r = post(url, {"messages": [user("x", jpeg_url(base[:2] + b"\xff\xfe\x00\x02" * 250_000 + base[2:]))]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("The image is a JPEG of more than 1,000 segments")
    assert decodes == []


def test_a_decode_that_runs_past_its_budget_is_given_up_at_the_next_block(monkeypatch):
    from PIL import ImageFile

    decoding = []  # set once Pillow starts decoding: from then on the budget is spent
    real_prepare = ImageFile.ImageFile.load_prepare
    monkeypatch.setattr(ImageFile.ImageFile, "load_prepare", lambda im: decoding.append(1) or real_prepare(im))
    reads = []
    real_clock = lambda: reads.append(1) or (100.0 if decoding else 0.0)  # noqa: E731
    from qvl_agent import image as image_module

    monkeypatch.setattr(image_module, "_decode", _with_clock(image_module._decode, real_clock))
    data = progressive_jpeg(1000, 60)  # within the scan limit, several decode blocks long
    with pytest.raises(ImageError) as caught:
        load_image_bytes(data, budget_s=5.0)
    assert str(caught.value) == (
        "The image took more than 5 s to open and decode and was given up; save it as PNG or as a baseline JPEG."
    )
    assert decoding  # it was stopped while decoding, not refused up front


def _with_clock(decode, clock):
    return lambda *a, **kw: decode(*a, **kw, clock=clock)


def test_ask_refuses_such_a_file_with_one_sentence(tmp_path):
    path = tmp_path / "scans.jpg"
    path.write_bytes(progressive_jpeg(300, 400))
    with pytest.raises(ImageError):
        load_image(path)
    replies = tmp_path / "replies.json"
    replies.write_text('["never asked"]')
    done = run_cli("ask", "--engine", f"replay:{replies}", "--image", str(path), "what is it?")
    assert done.returncode == 2, done.stderr
    assert "is a progressive JPEG of more than 100 scans" in done.stderr
    assert "Traceback" not in done.stderr and "never asked" not in done.stdout
