"""Development tools, not used at run time: the benchmark against plain transformers (`bench`) and the
tiny random Qwen3-VL that tests and demos build (`tiny_model`). Nothing in the runtime package imports
this one except the `bench` subcommand.
"""
