"""The OpenAI-compatible HTTP API over one resident engine: the app and its routes (`app`), bearer-token
authentication (`auth`), request and response models (`protocol`), the one generation thread
(`worker`), sessions pooled by conversation prefix (`pool`), SSE streaming (`stream`) and Prometheus
metrics (`metrics`).
"""
