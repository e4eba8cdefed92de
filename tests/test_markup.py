"""The [file: …] and [question: … | …] markers, parsed the same way for every adapter."""

from __future__ import annotations

from kesoku.vocab.markup import FilePart, QuestionPart, TextPart, parse_reply


def test_text_only_and_empty() -> None:
    assert parse_reply("Hello **there**.") == [TextPart("Hello **there**.")]
    assert parse_reply("") == []
    assert parse_reply("  \n ") == []


def test_a_file_on_its_own_line_splits_the_text() -> None:
    text = "Here is the report:\n[file: /srv/ws/report.pdf]\nAnything else?"
    assert parse_reply(text) == [
        TextPart("Here is the report:"),
        FilePart("/srv/ws/report.pdf"),
        TextPart("Anything else?"),
    ]


def test_a_question_with_choices() -> None:
    text = (
        "I found two configs.\n"
        "[question: Which one should I use? | dev.toml | prod.toml | dev.toml | ]"
    )
    assert parse_reply(text) == [
        TextPart("I found two configs."),
        QuestionPart("Which one should I use?", ("dev.toml", "prod.toml")),
    ]


def test_a_question_without_choices_is_plain_text() -> None:
    assert parse_reply("[question: Shall I go on?]") == [TextPart("Shall I go on?")]


def test_markers_inside_code_fences_are_text() -> None:
    text = "Use it like this:\n```\n[file: /tmp/x]\n[question: a | b]\n```\ndone [file: /w/a.png]"
    assert parse_reply(text) == [
        TextPart("Use it like this:\n```\n[file: /tmp/x]\n[question: a | b]\n```\ndone "),
        FilePart("/w/a.png"),
    ]


def test_an_unclosed_fence_runs_to_the_end_and_unknown_or_empty_markers_stay() -> None:
    assert parse_reply("```py\n[file: /x]") == [TextPart("```py\n[file: /x]")]
    assert parse_reply("[file: ] and [note: x]") == [TextPart("[file: ] and [note: x]")]
