"""Documentation markup taken out of Markdown at ingest, what a reader sees kept (issue 62, item 7a)."""

from __future__ import annotations

from pathlib import Path

from ingest import load_path
from ingest.loaders.markup import clean_markup


def test_reference_links_keep_their_text_and_definitions_go() -> None:
    source = (
        "See [`BaseModel`][pydantic.main.BaseModel], the [JSON schema][json-schema] page or [Fields][].\n"
        "![A diagram][diagram] shows it.\n\n"
        '[json-schema]: https://json-schema.org "JSON Schema"\n'
        "  [diagram]: img/d.png\n"
        "[^1]: A footnote is text.\n"
    )
    assert clean_markup(source) == (
        "See `BaseModel`, the JSON schema page or Fields.\nA diagram shows it.\n\n[^1]: A footnote is text.\n"
    )


def test_brackets_that_are_no_reference_link_stay() -> None:
    source = "Index it: `a[0][1]`, matrix[i][j] or `[x][y]`; a task: - [ ] [done](x.md).\n"
    assert clean_markup(source) == source
    assert clean_markup("```python\nsee = [text][ref]\n[ref]: not a definition\n```\n") == (
        "```python\nsee = [text][ref]\n[ref]: not a definition\n```\n"
    )


def test_attribute_lists_go_from_headings_block_ends_and_links() -> None:
    source = (
        "# Models {#models}\n\n"
        '## Defaults {.note data-x="a b" #defaults}\n\n'
        "Setext {#setext}\n--------\n\n"
        "The end of a paragraph. {: .lead }\n\n"
        '[Get started](start.md){ .md-button } or [API](api.md "API"){: target=_blank } now.\n'
        "{ .annotate }\n\n"
        "A set {#not-an-attr} inside a line, and ### Sets { of things } stay.\n"
    )
    assert clean_markup(source) == (
        "# Models\n\n## Defaults\n\nSetext\n--------\n\nThe end of a paragraph.\n\n"
        '[Get started](start.md) or [API](api.md "API") now.\n\n'
        "A set {#not-an-attr} inside a line, and ### Sets { of things } stay.\n"
    )


def test_admonitions_and_tabs_keep_their_titles_and_dedented_bodies() -> None:
    source = (
        '??? api "API Documentation"\n'
        "    [`pydantic.main.BaseModel`][pydantic.main.BaseModel]<br>\n"
        "    [`pydantic.fields.Field`][pydantic.fields.Field]<br>\n\n"
        "!!! note\n"
        "    Models are classes.\n\n"
        '    !!! warning "Careful"\n'
        "        A nested body, with a break<br>inside.\n\n"
        '!!! tip ""\n'
        "    No title shown.\n\n"
        "???+ example inline end\n"
        "    Open by default.\n\n"
        '=== "Python 3.9+"\n\n'
        "    ```python\n"
        "    x: list[int]\n"
        "    ```\n\n"
        "Back to text.\n\n"
        "Guide\n===\n"
    )
    assert clean_markup(source) == (
        "API Documentation\n\n"
        "`pydantic.main.BaseModel`\n"
        "`pydantic.fields.Field`\n\n"
        "Note\n\n"
        "Models are classes.\n\n"
        "Careful\n\n"
        "A nested body, with a break\ninside.\n\n"
        "No title shown.\n\n"
        "Example\n\n"
        "Open by default.\n\n"
        "Python 3.9+\n\n\n"
        "```python\n"
        "x: list[int]\n"
        "```\n\n"
        "Back to text.\n\n"
        "Guide\n===\n"
    )  # a setext heading's `===` is no tab


def test_code_annotations_go_and_annotated_prose_loses_its_markers() -> None:
    source = (
        "```python\n"
        "class User(BaseModel):\n"
        "    id: int  # (1)!\n"
        "    name: str = 'Jane'  # the default (2)\n"
        "    # (3)\n"
        "    size: int = f(1)  # stays (1 of 2)\n"
        "```\n\n"
        "1. `id` is required.\n"
        "2. `name` has a default.\n\n"
        "Lorem (1) ipsum dolor (2). { .annotate }\n\n"
        "1. An annotation.\n"
        "2. Another.\n\n"
        "Steps (1) and (2) without the mark stay.\n"
    )
    assert clean_markup(source) == (
        "```python\n"
        "class User(BaseModel):\n"
        "    id: int\n"
        "    name: str = 'Jane'  # the default\n"
        "\n"
        "    size: int = f(1)  # stays (1 of 2)\n"
        "```\n\n"
        "1. `id` is required.\n"
        "2. `name` has a default.\n\n"
        "Lorem ipsum dolor.\n\n"
        "1. An annotation.\n"
        "2. Another.\n\n"
        "Steps (1) and (2) without the mark stay.\n"
    )


def test_mkdocstrings_directives_become_the_path_they_document() -> None:
    source = (
        "# API\n\n"
        "::: pydantic.main.BaseModel\n"
        "    options:\n"
        "      show_root_heading: true\n\n"
        "::: pydantic.fields.Field\n\n"
        "Text.\n"
    )
    assert clean_markup(source) == "# API\n\npydantic.main.BaseModel\n\npydantic.fields.Field\n\nText.\n"


def test_a_markdown_file_is_cleaned_at_ingest(tmp_path: Path) -> None:
    source = (
        "# Models {#models}\n\n"
        '??? api "API Documentation"\n'
        "    [`pydantic.main.BaseModel`][pydantic.main.BaseModel]<br>\n\n"
        "A model is a class; see [fields][pydantic.fields].\n\n"
        "```py\nm = Model(x=1)  # (1)!\n```\n\n"
        "1. Validated here.\n\n"
        "[pydantic.fields]: https://docs.pydantic.dev/fields\n"
    )
    (tmp_path / "models.md").write_text(source)
    [document] = list(load_path(tmp_path / "models.md"))
    assert document.title == "Models"
    assert document.text == (
        "# Models\n\nAPI Documentation\n\n`pydantic.main.BaseModel`\n\n"
        "A model is a class; see fields.\n\n```py\nm = Model(x=1)\n```\n\n1. Validated here."
    )
