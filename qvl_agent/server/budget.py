"""How many prompt tokens a request costs, counted before it reaches the engine (`--max-prompt-tokens`).

A prompt's prefill time grows with its length (a 40,000-word prompt held the only generation thread for
minutes), so a request whose conversation is over the cap is refused with 400 before it is queued for
the engine. Text is counted with the engine's own tokenizer when it has one (the local engine), in
slices, stopping as soon as the count passes the cap, so even a body of many megabytes costs little;
an engine without a tokenizer (a remote server, which enforces its own limit) is estimated at one token
per four bytes. Each image counts the visual tokens the model will see: one per 32×32 pixels of the
image resized within the pixel cap, from the size in its header, before it is decoded.
"""

from __future__ import annotations

from qvl_agent.image import Screenshot
from qvl_agent.server.protocol import ApiError, ChatRequest

SLICE_CHARS = 16_384
MIN_IMAGE_PIXELS = 65_536  # the engine's smart-resize lower bound
PIXELS_PER_VISUAL_TOKEN = 32 * 32  # 16-pixel patches merged 2x2
TEMPLATE_TOKENS_PER_TURN = 8  # role markers and separators of the chat template


def image_tokens(width: int, height: int, max_pixels: int) -> int:
    pixels = min(max(width * height, MIN_IMAGE_PIXELS), max_pixels)
    return pixels // PIXELS_PER_VISUAL_TOKEN


def text_tokens(tokenizer, text: str, limit: int) -> int:
    """Tokens in `text`, counted slice by slice; stops early once the count is past `limit`."""
    count = 0
    for start in range(0, len(text), SLICE_CHARS):
        piece = text[start : start + SLICE_CHARS]
        if tokenizer is None:
            count += (len(piece.encode("utf-8", "surrogatepass")) + 3) // 4
        else:
            count += len(tokenizer.encode(piece, add_special_tokens=False))
        if count > limit:
            break
    return count


def check_prompt_tokens(
    chat: ChatRequest, tokenizer, max_prompt_tokens: int, max_pixels: int, sizes: dict | None = None
) -> int:
    """The request's prompt tokens (an estimate close to the engine's count); 400 past the cap. Images not
    yet decoded count by the (width, height) their header gave (`sizes`, keyed by `ImageRef`), so a request
    over the cap is refused before any pixel is decoded."""
    images = [im for t in chat.history for im in t.images] + list(chat.images)
    dims = [(im.width, im.height) if isinstance(im, Screenshot) else (sizes or {}).get(im) for im in images]
    count = sum(image_tokens(*wh, max_pixels) for wh in dims if wh)
    count += TEMPLATE_TOKENS_PER_TURN * (2 * len(chat.history) + 2)
    for text in chat.texts():
        if count > max_prompt_tokens:
            break
        count += text_tokens(tokenizer, text, max_prompt_tokens - count)
    if count > max_prompt_tokens:
        raise ApiError(
            400,
            f"The prompt is over this server's limit of {max_prompt_tokens:,} tokens "
            "(qvl-agent serve --max-prompt-tokens); shorten the conversation or start a new one.",
            param="messages",
            code="context_length_exceeded",
        )
    return count
