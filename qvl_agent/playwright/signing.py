"""The capture script's reports, signed in the page and checked in Python (standard library only).

Playwright's binding runs in the page's own world: what the capture script sends passes through the
page's `JSON.stringify` and serializer, which a page can replace, so the page sees every report. A report
therefore carries no secret: it is a string, HMAC-SHA256 signed with a key that stays inside the capture
script's closure. The key is only ever handled by `SIGN_JS`, which takes what it uses (typed arrays,
`JSON.stringify` on strings and numbers, `Object.keys`) when the script starts, before the page's own
scripts run, and never calls anything the page can replace afterwards: a page that reads every report
still cannot sign one of its own. The body is a JSON text written by `encode` (not by `JSON.stringify` of an
object, which would call a `toJSON` the page put on a prototype) and is signed as its UTF-16 code units.

A document that was loaded before the recording's first start gets the script late (`frame.evaluate`),
after its own scripts ran: there the page could have replaced those built-ins first.
"""

from __future__ import annotations

import hashlib
import hmac

MAC_CHARS = 64  # hex digits of the signature that starts each report
MAX_REPORT = 4_000_000  # characters: past the most a report's fields may hold, nothing is hashed

# Defines `encode(value)` (a JSON text), `mac(text)` (its signature in hex) and `quote`, `random`, from
# `key` (the HMAC key as a list of byte values) in the capture script's scope.
SIGN_JS = """
  const U8 = Uint8Array, U32 = Uint32Array, quote = JSON.stringify, keysOf = Object.keys, isArray = Array.isArray,
        finite = Number.isFinite, random = Math.random, floor = Math.floor,
        codeAt = Function.prototype.call.bind(String.prototype.charCodeAt);
  const K = new U32([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2]);
  const H0 = new U32([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
                      0x5be0cd19]);
  const KEY = new U8(64);
  for (let i = 0; i < key.length; i++) KEY[i] = key[i];
  const HEX = '0123456789abcdef';
  const room = (n) => new U8(((n + 72) >>> 6) << 6);  // n bytes, the 0x80 and the length, in 64-byte blocks
  const sha256 = (msg, n) => {  // msg: from room(n), its first n bytes the message
    const total = msg.length, bits = n * 8, w = new U32(64), h = new U32(8);
    msg[n] = 0x80;
    for (let i = n + 1; i < total; i++) msg[i] = 0;
    const high = floor(bits / 4294967296);
    for (let i = 0; i < 4; i++) {
      msg[total - 8 + i] = (high >>> (24 - 8 * i)) & 255;
      msg[total - 4 + i] = (bits >>> (24 - 8 * i)) & 255;
    }
    for (let i = 0; i < 8; i++) h[i] = H0[i];
    for (let at = 0; at < total; at += 64) {
      for (let i = 0; i < 16; i++) {
        const j = at + 4 * i;
        w[i] = (msg[j] << 24) | (msg[j + 1] << 16) | (msg[j + 2] << 8) | msg[j + 3];
      }
      for (let i = 16; i < 64; i++) {
        const x = w[i - 15], y = w[i - 2];
        const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
        const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
        w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
      }
      let a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
      for (let i = 0; i < 64; i++) {
        const s1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
        const t1 = (k + s1 + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
        const s0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
        const t2 = (s0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
        k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
      }
      h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
    }
    const out = new U8(32);
    for (let i = 0; i < 32; i++) out[i] = (h[i >>> 2] >>> (24 - 8 * (i & 3))) & 255;
    return out;
  };
  const mac = (text) => {
    const n = 64 + 2 * text.length, inner = room(n), outer = room(96);
    for (let i = 0; i < 64; i++) { inner[i] = KEY[i] ^ 0x36; outer[i] = KEY[i] ^ 0x5c; }
    for (let i = 0; i < text.length; i++) {
      const c = codeAt(text, i);
      inner[64 + 2 * i] = c >>> 8;
      inner[65 + 2 * i] = c & 255;
    }
    const first = sha256(inner, n);
    for (let i = 0; i < 32; i++) outer[64 + i] = first[i];
    const sum = sha256(outer, 96);
    let hex = '';
    for (let i = 0; i < 32; i++) hex += HEX[sum[i] >>> 4] + HEX[sum[i] & 15];
    return hex;
  };
  // JSON of the capture script's own data: strings and numbers through JSON.stringify (which looks for no
  // toJSON on them), objects and arrays walked here.
  const encode = (v) => {
    if (v === null || v === undefined) return 'null';
    const t = typeof v;
    if (t === 'string') return quote(v);
    if (t === 'number') return finite(v) ? quote(v) : 'null';
    if (t === 'boolean') return v ? 'true' : 'false';
    if (t !== 'object') return 'null';
    let out = '';
    if (isArray(v)) {
      for (let i = 0; i < v.length; i++) out += (i ? ',' : '') + encode(v[i]);
      return '[' + out + ']';
    }
    const names = keysOf(v);
    for (let i = 0; i < names.length; i++) out += (i ? ',' : '') + quote(names[i]) + ':' + encode(v[names[i]]);
    return '{' + out + '}';
  };
"""


def mac(text: str, key: bytes) -> str:
    """The signature `SIGN_JS` gives `text`: HMAC-SHA256 of its UTF-16 code units, in hex."""
    return hmac.new(key, text.encode("utf-16-be", "surrogatepass"), hashlib.sha256).hexdigest()


def signed(text: str, key: bytes) -> str:
    """A report as the capture script sends it (for tests)."""
    return mac(text, key) + text


def opened(payload, key: bytes) -> str | None:
    """The body of a report signed with `key`, or None for anything else."""
    if not isinstance(payload, str) or not MAC_CHARS < len(payload) <= MAX_REPORT:
        return None
    sign, text = payload[:MAC_CHARS], payload[MAC_CHARS:]
    return text if hmac.compare_digest(sign, mac(text, key)) else None
