"""`posttrain eval`: a model against a task app's seeds, as synth's eval does for its stack.

traces.py (pure): a rollout response -> trace rows (prompt, completion, reward, per-step info), JSONL and
SQLite writers. summary.py (pure): mean reward, pass@k, the table. collect.py: the concurrent /rollout calls
with a progress bar. serving.py: the model behind an OpenAI-compatible URL (a local vLLM rollout server, or
--inference-url). cluster.py: the same evaluation as a Kubernetes Job."""
