"""A .jsonl corpus as users have them (issue 51, item 4): its lines are text, messages and
turns in turn, real prose and MT-Bench questions; and what `placer collect` must record of
each line."""

from __future__ import annotations

import json
from pathlib import Path


def write_mixed_corpus(path: Path, trace_data) -> tuple[Path, list[dict]]:
    """The corpus at `path` (from fixtures_models' `trace_data`) and its records, in order."""
    questions = [json.loads(line)["turns"]
                 for line in trace_data.mt_bench.read_text().splitlines()[:4]]
    prose = trace_data.blocks()[70:74]
    records = []
    for i in range(4):
        records += [{"text": prose[i]},
                    {"messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": questions[i][0]}]},
                    {"turns": questions[i], "question_id": i}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path, records


def rendered_record(record: dict, tokenizer, generation_prompt: bool = False) -> list[int]:
    """The token ids of one line: its text, or its chat through the chat template."""
    if "text" in record:
        return tokenizer(record["text"])["input_ids"]
    messages = record.get("messages") or [{"role": "user", "content": t}
                                          for t in record["turns"]]
    text = tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
