"""A test-only OpenAI-compatible server on 127.0.0.1 that answers grounding questions from the truth.

It reads a ScreenSpot-format data set on its own (both public layouts, written here independently of
qvl_agent.eval so that a loader bug cannot agree with itself), and answers each chat request whose last
user turn holds one of the data set's images and instructions with a Qwen3-VL `left_click` tool call at
the centre of the element's box on the 0-1000 grid. With `wrong_every=K` every K-th item (1-based, in
data-set order) is answered at a point outside its box, so the exact lower accuracy is known. Anything
it does not know gets a reply that names no point.

    python -m tests.support.screenspot_oracle DATA [--wrong-every K] [--port P]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from PIL import Image


def _pixels_hash(img: Image.Image) -> str:
    return hashlib.sha1(img.convert("RGB").tobytes()).hexdigest()


def read_truth(data: Path) -> list[dict]:
    """[{image, instruction, box (x1, y1, x2, y2)}] in data-set order (files sorted, items in order)."""
    if data.is_dir():
        files = sorted(
            p
            for p in data.rglob("*")
            if p.suffix in (".json", ".jsonl") and not any(part.startswith(".") for part in p.relative_to(data).parts)
        )
    else:
        files = [data]
    truth = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        items = [json.loads(x) for x in text.splitlines() if x.strip()] if path.suffix == ".jsonl" else json.loads(text)
        if not (isinstance(items, list) and items and all(isinstance(d, dict) and "img_filename" in d for d in items)):
            continue  # a download's metadata, not data
        pro = any("img_size" in d or "ui_type" in d for d in items)
        folders = [path.parent, path.parent / "images", path.parent.parent / "images"]
        folders += [p for p in path.parent.iterdir() if p.is_dir()]
        for d in items:
            image = next(f / d["img_filename"] for f in folders if (f / d["img_filename"]).is_file())
            x, y, a, b = d["bbox"]
            box = (x, y, a, b) if pro else (x, y, x + a, y + b)
            truth.append({"image": image, "instruction": d["instruction"].strip(), "box": box})
    return truth


def _outside(box, width: int, height: int) -> tuple[int, int]:
    """A grid point whose pixel is well outside `box`."""
    for gx, gy in ((5, 5), (995, 995), (995, 5), (5, 995), (500, 5), (500, 995), (5, 500), (995, 500)):
        px, py = gx * width / 1000, gy * height / 1000
        if not (box[0] - 3 <= px <= box[2] + 3 and box[1] - 3 <= py <= box[3] + 3):
            return gx, gy
    raise ValueError(f"the box {box} covers the whole image")


def _inside(box, width: int, height: int) -> tuple[float, float]:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    gx, gy = cx * 1000 / width, cy * 1000 / height
    if box[0] <= round(gx) * width / 1000 <= box[2] and box[1] <= round(gy) * height / 1000 <= box[3]:
        return round(gx), round(gy)  # whole numbers, as the model writes them, when they still hit
    return round(gx, 2), round(gy, 2)


class GroundingOracle:
    def __init__(self, data: str | Path, wrong_every: int = 0):
        self.answers: dict[tuple[str, str], tuple[float, float]] = {}
        for n, t in enumerate(read_truth(Path(data)), 1):
            with Image.open(t["image"]) as img:
                key = (_pixels_hash(img), t["instruction"])
                w, h = img.size
            wrong = wrong_every and n % wrong_every == 0
            self.answers[key] = _outside(t["box"], w, h) if wrong else _inside(t["box"], w, h)
        self.requests = 0

    def reply(self, body: dict) -> str:
        self.requests += 1
        user = [m for m in body.get("messages", []) if m.get("role") == "user"][-1]
        parts = user["content"] if isinstance(user["content"], list) else [{"type": "text", "text": user["content"]}]
        text = " ".join(p["text"] for p in parts if p.get("type") == "text").strip()
        urls = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
        if not urls:
            return "There is no screenshot."
        with Image.open(io.BytesIO(base64.b64decode(urls[-1].split(",", 1)[1]))) as img:
            point = self.answers.get((_pixels_hash(img), text))
        if point is None:
            return "I cannot find that on the screen."
        call = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": list(point)}}
        return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


def serve(oracle: GroundingOracle, port: int = 0) -> ThreadingHTTPServer:
    """The oracle behind /v1/models and /v1/chat/completions (streamed or not) on 127.0.0.1."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args) -> None:
            pass

        def _json(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/").endswith("/models"):
                return self._json(200, {"object": "list", "data": [{"id": "oracle", "object": "model"}]})
            self._json(404, {"error": {"message": "not found"}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                return self._json(404, {"error": {"message": "not found"}})
            reply = oracle.reply(body)
            if not body.get("stream"):
                choice = {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
                return self._json(200, {"object": "chat.completion", "model": "oracle", "choices": [choice]})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": reply}}]}
            usage = {"object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": 20}}
            for event in (chunk, usage):
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--wrong-every", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    httpd = serve(GroundingOracle(args.data, args.wrong_every), args.port)
    print(f"http://127.0.0.1:{httpd.server_address[1]}/v1", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
