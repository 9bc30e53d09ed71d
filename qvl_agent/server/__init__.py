"""The OpenAI-compatible HTTP API over one resident engine: the app and its routes (`app`), who may use
it (`auth`), request models and reply shapes (`protocol`), slow and broken clients (`transport`), image
decoding within a budget (`images`) and guarded URL fetching (`fetch`), the prompt-token cap (`budget`),
the one generation thread (`worker`), sessions pooled by conversation prefix (`pool`), SSE streaming
(`stream`) and Prometheus metrics (`metrics`).
"""
