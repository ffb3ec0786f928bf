"""Measuring speculative decoding against plain decoding: `spekula bench | tune | audit`.

workloads.py  the built-in suite (suite/*.jsonl, with sources) and users' JSON Lines files
runner.py     configurations over one loaded target, run interleaved in-process
endpoint.py   the same requests against OpenAI-compatible endpoints (openai client)
metrics.py    per-request results and summaries (aggregated from trace.RequestStats)
tune.py       the sweep's table, the recommendation, the config file for `generate --config`
audit.py      greedy equality and chi-square tests of the sampled distribution
manifest.py   models and hashes, packages, machine, seeds, git commit
report.py     Markdown, plots (matplotlib, PNG) and the self-contained HTML report
results.py    the result file and where the outputs go
commands.py   bench / tune / audit as library functions over loaded configurations
cli.py        options, model loading, printing
"""
