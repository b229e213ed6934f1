"""The user-like chats (`train/user_chats.py`): a held-out set no training request repeats, and
training requests from the other half of every source."""
import json
import random

from flashtree.train import user_chats
from flashtree.train.chats import HELDOUT_USER_CHATS as USER_CHATS
from flashtree.train.chats import chat_prompts
from flashtree.train.corpus import HELDOUT_PACKAGES, package_files


def _user_texts(rows):
    return {m["content"] for r in rows for m in r["messages"] if m["role"] == "user"}


def test_the_held_out_user_set_holds_each_part_and_no_training_request():
    rows = [json.loads(line) for line in USER_CHATS.read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert len(rows) == 48
    assert kinds.count("code-other") == 8 and kinds.count("code-python") == 8 and kinds.count("everyday") == 16
    parts = ["second" if k.startswith("second-") else k for k in kinds]
    assert all(parts[:16].count(p) == 4 for p in ("code-other", "code-python", "everyday", "second"))  # any prefix mixes
    seconds = [r for r in rows if r["kind"].startswith("second-")]
    assert len(seconds) == 16
    for r in seconds:  # first turn, the target's answer, then a held-out follow-up
        assert [m["role"] for m in r["messages"]] == ["user", "assistant", "user"]
        assert r["messages"][1]["content"].strip()
        assert r["messages"][2]["content"] in user_chats.HELDOUT_FOLLOW_UPS
    assert not set(user_chats.HELDOUT_FOLLOW_UPS) & set(user_chats.FOLLOW_UPS)
    held = _user_texts(rows)
    training = (_user_texts(user_chats.user_requests()) | _user_texts(user_chats.more_general_requests())
                | _user_texts(chat_prompts("train")))
    assert not held & training
    # the everyday questions are the ones written for the set, never a template's
    everyday = [r["messages"][0]["content"] for r in rows if r["kind"] in ("everyday", "second-everyday")]
    assert set(everyday) <= set(user_chats.HELDOUT_QUESTIONS)
    python = [r for r in rows if r["kind"] == "code-python"]
    assert all(r["id"].split("/")[1] in HELDOUT_PACKAGES for r in python)


def test_code_files_split_by_path_and_training_skips_the_held_out_packages(tmp_path):
    train, held = user_chats.code_files("train"), user_chats.code_files("heldout")
    assert train and held and not set(train) & set(held)
    assert all(user_chats._held(p) for p in held) and not any(user_chats._held(p) for p in train)
    root = tmp_path / "site-packages"
    for name in ("xgrammar", "ordinary"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text('def f():\n    """Do a thing."""\n')
    found = {p.parent.name for p in package_files(root)}
    assert found == {"ordinary"} and "xgrammar" in HELDOUT_PACKAGES


def test_a_snippet_is_whole_lines_within_the_limit():
    text = "\n".join(f"int line_{i} = {i};  // a line of C with some words in it" for i in range(200))
    for seed in range(5):
        body = user_chats.snippet(text, random.Random(seed))
        assert body is not None and len(body) <= user_chats.MAX_CODE_CHARS
        assert all(ln in text.splitlines() for ln in body.splitlines())
    assert user_chats.snippet("int x;\n" * 5, random.Random(0)) is None


def test_everyday_requests_cover_every_topic_and_template():
    rows = user_chats.general_requests()
    assert len(rows) == len(user_chats.TOPICS) * len(user_chats.QUESTION_TEMPLATES)
    assert len(_user_texts(rows)) == len(rows)
    second = user_chats.second_turn(rows[0]["messages"], "An answer.", "Why?")
    assert [m["role"] for m in second] == ["user", "assistant", "user"] and rows[0]["messages"] != second
