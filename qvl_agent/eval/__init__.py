"""Evaluation harnesses: ScreenSpot-family grounding accuracy (`screenspot`) and MiniWoB++ task success
(`miniwob`), both through any engine, both writing `results.jsonl` and `report.html` (`report`)."""
