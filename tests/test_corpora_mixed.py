""".jsonl corpora as users have them (issue 51, item 4): each line chooses its own form, the
text field, else `messages`, else `turns`; a line with none of them is one line naming the
file, the line and the fields found. A file of one form reads as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error

from traces.collecting.corpora import open_corpus
from traces.errors import TraceError

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
LINES = [{"text": "plain prose"},
         {"messages": CHAT},
         {"turns": ["first question", "and a follow-up"]},
         {"text": "text wins", "messages": CHAT},          # the text field comes first
         {"text": None, "turns": ["null is no field"]},   # a null column of a mixed dataset
         {"messages": CHAT, "turns": ["messages come before turns"]}]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_each_line_of_a_mixed_jsonl_chooses_its_own_form(tmp_path):
    corpus = open_corpus(write_jsonl(tmp_path / "mixed.jsonl", LINES))
    docs = list(corpus.documents())
    assert corpus.num_documents == len(docs) == 6 and corpus.kind == "mixed"
    assert docs[0].text == "plain prose" and docs[0].messages is None
    assert docs[1].messages == tuple(CHAT) and not docs[1].turns
    assert docs[2].messages == ({"role": "user", "content": "first question"},
                                {"role": "user", "content": "and a follow-up"})
    assert docs[2].turns and docs[2].text is None
    assert docs[3].text == "text wins" and docs[3].messages is None
    assert docs[4].messages == ({"role": "user", "content": "null is no field"},)
    assert docs[5].messages == tuple(CHAT)


def test_the_text_field_option_names_each_lines_text(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"body": "a"}, {"messages": CHAT}, {"text": "x",
                                                                                  "body": "b"}])
    docs = list(open_corpus(path, text_field="body").documents())
    assert [d.text for d in docs] == ["a", None, "b"]
    with pytest.raises(TraceError, match="line 1: no field 'text'"):
        open_corpus(path)


def test_a_line_of_no_form_names_the_file_the_line_and_its_fields(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [LINES[0], LINES[1], {"prompt": "?", "id": 3},
                                                LINES[2]])
    with pytest.raises(TraceError) as caught:
        open_corpus(path)
    assert str(caught.value) == (f"corpus {path} line 3: no field 'text' (nor 'messages' / "
                                 "'turns'); fields: id, prompt; choose the text field with "
                                 "--text-field")


def test_the_fields_of_a_refused_line_stay_one_short_line(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [LINES[1], {"text": None}, LINES[0]])
    with pytest.raises(TraceError, match=r"line 2: no field 'text' .*fields: text \(null\);"):
        open_corpus(path)
    many = {f"k{i:03d}": i for i in range(500)} | {"a\nb": 1}
    write_jsonl(path, [many])
    with pytest.raises(TraceError) as caught:
        open_corpus(path)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    assert 'fields: "a\\nb", k000, ' in message and "(501 in all)" in message
    write_jsonl(path, [{}])
    with pytest.raises(TraceError, match="fields: none;"):
        open_corpus(path)


def test_a_bad_chat_line_in_a_mixed_file_names_its_line(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [LINES[0], LINES[2], {"messages": "hello"}])
    with pytest.raises(TraceError, match=r"line 3: 'messages' is not a list of \{role, content"):
        open_corpus(path)
    write_jsonl(path, [LINES[1], {"text": 7}])
    with pytest.raises(TraceError, match="line 2: field 'text' is not a string"):
        open_corpus(path)


@pytest.mark.parametrize(("records", "kind"), [
    ([{"text": "a"}, {"text": "b", "messages": CHAT}], "jsonl-text"),
    ([{"messages": CHAT}, {"messages": CHAT[1:], "turns": ["x"]}], "chat"),
    ([{"turns": ["a", "b"]}, {"turns": ["c"]}], "turns"),
])
def test_a_file_of_one_form_reads_as_before(tmp_path, records, kind):
    corpus = open_corpus(write_jsonl(tmp_path / "one.jsonl", records))
    assert corpus.kind == kind and corpus.num_documents == len(records)
    docs = list(corpus.documents())
    if kind == "jsonl-text":
        assert [d.text for d in docs] == ["a", "b"]
    elif kind == "chat":
        assert [d.messages for d in docs] == [tuple(CHAT), tuple(CHAT[1:])]
    else:
        assert [len(d.messages) for d in docs] == [2, 1] and all(d.turns for d in docs)


def test_bench_prompts_take_the_first_turn_of_turns_lines_only(tmp_path):
    """`placer bench --prompts`: a `turns` line is its first turn, a `messages` line the whole
    chat, line by line in a mixed file."""
    from placer.serve.bench import read_prompts

    def tokenizer(text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    path = write_jsonl(tmp_path / "p.jsonl", [LINES[2], LINES[1], LINES[0]])
    prompts = ["".join(map(chr, p)) for p in read_prompts(path, tokenizer)]
    assert prompts == ["user: first question", "system: Be brief.\nuser: Hi?", "plain prose"]


def test_collect_refuses_a_line_of_no_form_in_one_line(tmp_path, cli):
    path = write_jsonl(tmp_path / "bad.jsonl", [LINES[0], LINES[1], {"question": "?"}])
    result = cli("collect", "--model", tmp_path / "no-model", "--corpus", path, "--out",
                 tmp_path / "out", "--no-progress", ok=False)
    assert_one_line_error(result, f"corpus {path} line 3: no field 'text'", "fields: question")
