"""The training configuration's fields as `invar train --help` lists them: (dotted name, default, docstring with its
range), as `invar.loop.config.field_help()` gives them.

Why a table: reading them from the configuration's pydantic models imports the configuration, numpy and the tasks,
which cost the help about 0.2 CPU s of its start; tests/cli/test_train_cli.py holds this table equal to
`field_help()`, and `python -m invar.cli.train_fields` rewrites it from there.
"""

from __future__ import annotations

FIELDS: tuple[tuple[str, str, str], ...] = (
    (
        'name',
        'required',
        "The run's name (runs go to runs/train-<name>-<time> unless --run is given).",
    ),
    (
        'backend',
        'required',
        '`mlx`: MLX generates and learns. `hf`: Hugging Face generates and learns. `vllm+hf`: vLLM '
        'generates, Hugging Face learns (through peft).',
    ),
    (
        'model',
        "'../models/tiny-arith'",
        'The base model folder, relative to the configuration file (named in the records by its tree '
        'digest).',
    ),
    (
        'dtype',
        "'float32'",
        'The dtype both engines load the base model in.',
    ),
    (
        'engines',
        '{}',
        "Launch settings of the backend's engine workers, by engine: e.g. `[engines.mlx]` `blas = "
        '"openblas"`, `[engines.hf]` `threads = 2`, `[engines.vllm]` `max_num_seqs = 64` (the launch '
        'options `invar use package ENGINE` lists). Every worker of that engine, in either role, starts '
        "with them and reports them in its identity. They are part of the configuration's digest, so a "
        "run resumes only with the settings it was made with. Omitted (or an empty table): each worker's "
        'defaults.',
    ),
    (
        'seed',
        '0',
        "The run seed: each cycle's prompts, every request's sampling seed and the fresh adapter's init "
        'derive from it. Range: [0, 2^63).',
    ),
    (
        'cycles',
        '20',
        'Cycles to run: each samples, updates once and publishes one checkpoint. Range: [1, 100000].',
    ),
    (
        'prompts.path',
        "'../data/arith-train.jsonl'",
        'The prompts: a population file (JSON lines `{id, prompt or messages, answer, kind?, meta?}`), '
        'relative to the configuration file. On the arithmetic task every prompt must belong to the '
        '`train` split: the evaluation population is never trained on.',
    ),
    (
        'prompts.sha256',
        'None',
        'sha256 of the prompts file; omitted: the digest in the `.sha256` file beside it.',
    ),
    (
        'prompts.per_cycle',
        '16',
        'Prompts drawn for each cycle (without replacement within a cycle; seeded by the run seed and '
        'the cycle). Range: [1, 4096].',
    ),
    (
        'prompts.kinds',
        'None',
        'Train only on units of these kinds (their `kind` labels, e.g. `["mul", "muladd"]`); omitted: '
        'every unit in the file.',
    ),
    (
        'rollout.group_size',
        '8',
        "G: samples per prompt. Advantages are relative to a prompt's group, so G must be at least 2. "
        'Range: [2, 256].',
    ),
    (
        'rollout.temperature',
        '1.0',
        'T: the rollout temperature. The engine samples at T and reports log-probabilities at T; the '
        'learner scores the same tokens at T. Greedy (0) is refused: it has no sampling distribution to '
        'correct for. Range: (0, 10].',
    ),
    (
        'rollout.max_tokens',
        '5',
        'The most response tokens per sample, end-of-sequence included (5 fits every arithmetic answer). '
        'Range: [1, 65536].',
    ),
    (
        'rollout.batch_size',
        'None',
        "Requests per engine batch within each generate call; omitted: each call's requests in one "
        'batch. A schedule knob: every request carries its own seed, and the engines are batch-invariant '
        'on CPU (MLX, vLLM; HF is not: on hf, the rollouts depend on the batch layout). Range: [1, '
        '65536].',
    ),
    (
        'rollout.staleness',
        '0',
        'K, the declared staleness: cycle c samples the policy published by cycle c − K − 1 (version '
        "max(0, c − K)), so with K ≥ 1 the engines generate the next cycles' rollouts while the learner "
        'updates (asynchronous mode); the learner still starts from the checkpoint published last, and '
        'the importance weight corrects for the lag. Rollouts of any other policy are refused. 0: '
        'synchronous. Changes the policies (a run of K = 1 is not a reschedule of a run of K = 0). '
        'Range: [0, 16].',
    ),
    (
        'rollout.workers',
        '1',
        "Inference workers generating each cycle's rollouts: the cycle's prompt groups are split into "
        'this many contiguous shards, one generate call per worker (one after the other; the records are '
        'written by one process). A schedule knob. Range: [1, 8].',
    ),
    (
        'rollout.layout',
        "'split'",
        'Where the inference engine and the learner run: `split`, a worker process for each; `shared`, '
        'one worker process serving both roles (mlx and hf), each on its own protocol channel under its '
        'own identity, their calls answered in turn. A schedule knob: every call and report is the one a '
        'split run records, and the published policies are the same (`invar compare histories` checks '
        "it); the run's metadata says where the roles ran.",
    ),
    (
        'lora.r',
        '8',
        "The adapter's rank (at most 8 when vLLM serves it: its `--max-lora-rank`). Range: [1, 256].",
    ),
    (
        'lora.alpha',
        '16.0',
        'lora_alpha; the update is scaled by alpha / r. Range: (0, 1000000].',
    ),
    (
        'lora.targets',
        "['q_proj', 'v_proj']",
        'The projections adapted in every decoder layer. Range: 1 to 7 entries.',
    ),
    (
        'optimizer.name',
        "'adamw'",
        "AdamW with bias correction (torch's; mlx's with `bias_correction=True`).",
    ),
    (
        'optimizer.lr',
        '0.001',
        'Learning rate. Range: (0, 1].',
    ),
    (
        'optimizer.betas',
        '(0.9, 0.999)',
        "AdamW's β1, β2, each in [0, 1).",
    ),
    (
        'optimizer.eps',
        '1e-08',
        "AdamW's ε. Range: (0, 1].",
    ),
    (
        'optimizer.weight_decay',
        '0.0',
        'Decoupled weight decay. Range: [0, 1].',
    ),
    (
        'optimizer.max_grad_norm',
        '1.0',
        'Clip the gradient to this global L2 norm; null: no clipping. Range: > 0.',
    ),
    (
        'objective.clip_low',
        '0.2',
        'PPO clip below: the ratio is clipped at 1 − clip_low. Range: [0, 1).',
    ),
    (
        'objective.clip_high',
        '0.28',
        "PPO clip above: the ratio is clipped at 1 + clip_high (DAPO's clip-higher when above clip_low). "
        'Range: [0, 10].',
    ),
    (
        'objective.importance',
        "'truncate'",
        'What is done with the importance weight w = exp(proximal − behavior) above `importance_cap`: '
        "`truncate` uses min(w, cap) (truncated importance sampling), `mask` drops the token's policy "
        'term (w = 0), `none` uses w as it is.',
    ),
    (
        'objective.importance_cap',
        '2.0',
        'The cap C of `truncate` and `mask`; must be null with `none`. Range: (1, 1000000].',
    ),
    (
        'objective.kl_coef',
        '0.0',
        'β: weight of the k3 estimator of KL(current ‖ reference); 0 disables it (and the reference '
        'scoring). Range: [0, 100].',
    ),
    (
        'objective.reference',
        "'base'",
        'The reference policy of the KL term: `base`, the model without an adapter (the policy cycle 0 '
        'starts from). The engine scores the sampled tokens under it in the same rollout.',
    ),
    (
        'objective.loss_aggregation',
        "'token-mean'",
        "How per-token terms become the loss: the mean over every response token of the cycle's batch. N "
        "counts the whole batch before any micro-batching (the learners divide every sample's sum by it; "
        'the core checks the count), so the step does not depend on how a learner splits the batch.',
    ),
    (
        'advantage.normalization',
        "'mean-std'",
        "`mean-std` (GRPO): (r − group mean) / (group std + eps), std with Bessel's correction; `mean` "
        '(Dr. GRPO): r − group mean, no division. A group whose rewards are all equal gets A = 0 either '
        'way, and is counted.',
    ),
    (
        'advantage.eps',
        '1e-06',
        'ε added to the group std (`mean-std` only). Range: (0, 1].',
    ),
    (
        'learner.micro_batch',
        'None',
        'Sequences per micro-batch (gradient accumulation); omitted: the whole batch in one. The token '
        "mean's N is fixed before the batch is split, so the loss is the same for any split. Range: [1, "
        '65536].',
    ),
    (
        'learner.reduction',
        'None',
        "How per-sequence gradients become the step's gradient. `float64-sequence` (the MLX learner's "
        "default): each sequence's gradient is computed on its own and summed in float64 in sequence "
        'order, then rounded once to float32, so any micro-batch size gives the same bits. '
        '`float32-microbatch` is a negative control, not for training: one float32 gradient per '
        'micro-batch, summed in float32 in micro-batch order, so the policy depends on the micro-batch '
        'size. Omitted: `float64-sequence` on mlx, and on hf and vllm+hf when `micro_batch` is given; '
        'with neither field, the HF learner scores the whole batch in one padded forward and takes one '
        "backward (its rows then depend on the batch's padding: HF is not batch-invariant), so give a "
        'reduction to compare schedules on hf.',
    ),
    (
        'scorer.name',
        "'arithmetic-exact'",
        'A built-in scorer (`exact-match`, `numeric`, `regex`, `choice`, `contains`, '
        '`arithmetic-exact`), or `path.py:function`, a function in a file relative to the configuration '
        'file. Range: 1 to 4096 characters.',
    ),
    (
        'scorer.settings',
        '{}',
        "The scorer's settings (each scorer's are listed in docs/your-model.md).",
    ),
    (
        'scorer.sha256',
        'None',
        "A user scorer's file sha256; omitted: the file's digest when the run starts, which the run "
        'records and a resumed run must still match.',
    ),
)
"""(dotted name, default, docstring) per field, in `field_help()`'s order."""

_WIDTH = 96  # characters of a docstring per source line


def _source() -> str:
    """This module's text with FIELDS written from `field_help()`."""
    import re
    from pathlib import Path

    from invar.loop.config import field_help

    lines = []
    for name, default, doc in field_help():
        lines.append("    (")
        for text in (name, default):
            lines.append(f"        {text!r},")
        chunks = [""]
        for word in re.findall(r"\S+\s*", doc):  # whole words per line, each line's spaces kept at its end
            if chunks[-1] and len(chunks[-1]) + len(word) > _WIDTH:
                chunks.append("")
            chunks[-1] += word
        lines.extend(f"        {chunk!r}" for chunk in chunks[:-1])
        lines.append(f"        {chunks[-1]!r},")
        lines.append("    ),")
    text = Path(__file__).read_text(encoding="utf-8")
    head, rest = text.split("FIELDS: tuple[tuple[str, str, str], ...] = (\n", 1)
    tail = rest[rest.index(")\n\"\"\"(dotted name"):]
    return head + "FIELDS: tuple[tuple[str, str, str], ...] = (\n" + "\n".join(lines) + "\n" + tail


if __name__ == "__main__":
    from pathlib import Path

    Path(__file__).write_text(_source(), encoding="utf-8")
