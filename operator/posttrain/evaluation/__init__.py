"""`posttrain eval`: a model against a task app's seeds, as synth's eval does for its stack.

traces.py (pure): a rollout response -> trace rows (prompt, completion, reward, per-step info), JSONL and
SQLite writers. summary.py (pure): mean reward, pass@k, the table. collect.py: the concurrent /rollout calls
with a progress bar. cluster.py: the same evaluation as a Kubernetes Job. The model behind an
OpenAI-compatible URL (a vLLM rollout server started on this machine, or --inference-url) is the local
backend's (posttrain/local/serving.py): this package imports no other engine (docs/architecture.md)."""
