"""Chats as users send them, beyond requests about the stdlib's documented functions: code in
other languages, everyday questions, second turns.

Two disjoint halves. The held-out half (`heldout_user_requests`, written with the target's first
answers to `data/heldout_user_chats.jsonl` by `scripts/user_chats.py`) measures a drafter where
users are: code in languages no training request before it quoted (C, C++, JavaScript, SQL, shell,
HTML, CSS, Markdown) from files whose path hash falls in the held-out share, Python from the
packages in `corpus.HELDOUT_PACKAGES` (never read for training), everyday questions written for it,
and second turns after the target's own greedy first answer, with follow-ups of their own. The
training half (`user_requests`) comes from the rest: the other files, questions built from topic x
template (none of the held-out questions), and follow-ups from a separate list after answers the
target already gave (`second_turn`). Nothing here runs a model or tokenises; which files exist
depends on the machine, so the committed data, not this module, is what a run reproduces.
"""
from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from pathlib import Path

from .chats import _requests
from .corpus import HELDOUT_PACKAGES, packages_root, read_source

# extension -> the language a user names
LANGUAGES = {".c": "C", ".h": "C", ".cpp": "C++", ".cc": "C++", ".hpp": "C++", ".js": "JavaScript",
             ".sql": "SQL", ".sh": "shell", ".html": "HTML", ".css": "CSS", ".md": "Markdown"}
HELDOUT_SHARE = 8          # a file whose path hash is 0 mod this is held out
MAX_CODE_CHARS = 1200      # as chats.MAX_CODE_CHARS: a quoted snippet stays a small part of the context
MAX_FILES_PER_LANGUAGE = 600
MAX_FILES_PER_FOLDER = 6   # generated headers come by the thousand in one folder: spread over projects

CODE_TEMPLATES = (
    ("explain", "Explain what this {lang} code does:\n\n{block}"),
    ("review", "Can you find any bugs or problems in this {lang} code?\n\n{block}"),
    ("edit", "Add comments to this {lang} code so a beginner can follow it:\n\n{block}"),
    ("translate", "Rewrite this {lang} code in Python:\n\n{block}"),
)
DOC_TEMPLATES = (
    ("summarise", "Summarise this text in a few sentences:\n\n{block}"),
    ("explain", "What are the key points of this README?\n\n{block}"),
)

TOPICS = (
    "baking sourdough bread", "making a budget", "learning to swim", "growing tomatoes", "training a puppy",
    "saving for retirement", "running a first marathon", "learning a new language", "reducing stress",
    "planning a wedding", "buying a used car", "writing a resume", "preparing for a job interview",
    "starting a small business", "photography for beginners", "composting at home", "brewing coffee",
    "improving sleep", "meal prepping", "decluttering a home", "hiking safety", "camping with kids",
    "learning the guitar", "public speaking", "negotiating a salary", "time management", "remote work",
    "climate change", "the water cycle", "photosynthesis", "black holes", "the French Revolution",
    "the Roman Empire", "ancient Egypt", "the printing press", "the industrial revolution", "vaccines",
    "the immune system", "healthy eating", "strength training", "yoga", "meditation", "chess openings",
    "the stock market", "inflation", "credit scores", "renting versus buying a home", "electric cars",
    "solar panels", "recycling", "bees and pollination", "volcanoes", "earthquakes", "the solar system",
    "the moon landing", "artificial intelligence", "social media and teenagers", "online privacy",
    "password security", "choosing a laptop", "setting up a home network", "backing up photos",
    "learning to draw", "writing poetry", "reading more books", "Shakespeare's plays", "jazz history",
    "classical music", "making friends as an adult", "moving to a new city", "travelling on a budget",
    "visiting Japan", "a weekend in Paris", "packing for a long trip", "jet lag", "learning to cook",
    "vegetarian recipes", "food allergies", "raising teenagers", "caring for an elderly parent",
    "houseplants", "keeping chickens", "bird watching", "astronomy as a hobby", "knitting",
    "woodworking", "fixing a leaky tap", "painting a room", "first aid basics", "dealing with burnout",
    "studying for exams", "writing an essay", "giving feedback at work", "leading a team",
    "customer service", "marketing a product", "email etiquette", "the history of the internet",
    "how airplanes fly", "how bridges are built", "ocean tides", "rainforests", "deserts", "glaciers",
    "dinosaurs", "evolution", "DNA", "the human heart", "nutrition labels", "drinking enough water",
)
QUESTION_TEMPLATES = (
    "What should I know about {t}?",
    "Explain {t} to a complete beginner.",
    "Give me five practical tips for {t}.",
    "What are the most common mistakes people make with {t}?",
    "Write a short blog post about {t}.",
    "I'm curious about {t}. Where should I start?",
    "Can you write a short story that involves {t}?",
    "Write a friendly email to a colleague about {t}.",
    "What are the pros and cons of {t}?",
    "Make a step-by-step plan for {t}.",
    "Write a poem about {t}.",
    "Summarise the main ideas behind {t} in a paragraph.",
)
# A second list for the second round of training data (`more_general_requests`): other phrasings,
# other shapes of answer (a dialogue, an outline, a myth corrected), none a held-out question.
MORE_QUESTION_TEMPLATES = (
    "Can you help me understand {t}?",
    "I have to give a five-minute talk on {t}. Can you outline it?",
    "Tell me some fun facts about {t}.",
    "My friend says {t} is overrated. What do you think?",
    "How has {t} changed over the last fifty years?",
    "Write a short dialogue between two friends talking about {t}.",
    "What three questions should I ask an expert on {t}?",
    "Describe {t} in simple words for a child.",
    "List the tools or resources someone needs for {t}.",
    "What is a common myth about {t}, and what is the truth?",
    "Write a haiku and a limerick about {t}.",
    "How would you explain {t} in a text message to a friend?",
)
FOLLOW_UPS = (
    "Can you explain that more simply?", "Thanks! Can you make it shorter?", "Can you give me an example?",
    "What would you change to make it better?", "Why does that work?", "Can you put that in a table?",
    "What are the edge cases I should watch for?", "Now add error handling.", "Can you summarise that in "
    "three bullet points?", "What did you mean by the last part?", "Is there a faster way to do it?",
    "Can you write tests for that?", "Could you go into more detail on the first point?",
    "How would I explain this to my manager?", "What should I read next to learn more?",
    "Please rewrite it in a more formal tone.", "OK. What are the alternatives?",
    "Can you turn that into a checklist?", "What are the risks?", "Great, and how long would that take?",
)

# The held-out half: written for it, none built from the templates or topics above.
HELDOUT_QUESTIONS = (
    "My sourdough starter smells like nail polish remover. Is it ruined, and what do I do now?",
    "How do I politely tell my neighbour that their dog barks all night?",
    "Plan a three-day trip to Lisbon for two people who love food and walking.",
    "What's the difference between a Roth IRA and a traditional IRA, in plain words?",
    "Write a birthday message for my grandmother who is turning 90.",
    "Why is the sky blue but sunsets are orange?",
    "I have chicken, rice, spinach and a lemon. What can I cook tonight in 30 minutes?",
    "How can I stop procrastinating when I work from home?",
    "Explain how a mortgage interest rate affects my monthly payment.",
    "Write a cover letter opening paragraph for a junior data analyst job.",
    "What causes the seasons on Earth?",
    "Give me a beginner's weekly workout plan with no equipment.",
    "How do noise-cancelling headphones work?",
    "My tomato plant's leaves are turning yellow from the bottom up. What is wrong?",
    "Summarise the plot of Pride and Prejudice without spoilers for the ending.",
    "What questions should I ask when I visit a daycare for my toddler?",
    "How do I say no to extra work without hurting my career?",
    "Explain what a black hole is to a ten-year-old.",
    "Write a short speech for my best friend's wedding. He loves fishing and bad puns.",
    "Which is better for a small apartment, a cat or a rabbit?",
    "How do vaccines train the immune system?",
    "I keep waking up at 3 am. What could help me sleep through the night?",
    "Suggest a name and a slogan for a bakery that only sells pies.",
    "What happened at the Battle of Hastings and why does it matter?",
)
HELDOUT_FOLLOW_UPS = (
    "Hmm, I don't get it. Can you say it another way?", "Shorter please, I'm on my phone.",
    "Could you show me a concrete example of that?", "Is any of that wrong or risky?",
    "Great. What would an expert add to this?", "OK, now list it as numbered steps.",
    "Why did you do it that way and not another?", "Can you redo it for a total beginner?",
)


def _held(path: Path) -> bool:
    return int(hashlib.sha1(path.as_posix().encode()).hexdigest(), 16) % HELDOUT_SHARE == 0


def code_files(split: str) -> list[Path]:
    """Files in the `LANGUAGES` under site-packages and /usr (include, share), sorted, the first
    MAX_FILES_PER_LANGUAGE of each extension, in `split` ("train" or "heldout") by path hash."""
    roots = [packages_root(), Path(sysconfig.get_paths()["include"]), Path("/usr/include"), Path("/usr/share")]
    found: dict[str, list[Path]] = {}
    for root in roots:
        if not root.is_dir():
            continue
        for d, dirs, files in os.walk(root):
            dirs.sort()
            taken = 0
            for f in sorted(files):
                ext = os.path.splitext(f)[1]
                p = Path(d) / f
                if ext in LANGUAGES and taken < MAX_FILES_PER_FOLDER and _held(p) == (split == "heldout"):
                    found.setdefault(ext, []).append(p)
                    taken += 1
    return [p for ext in sorted(found) for p in found[ext][:MAX_FILES_PER_LANGUAGE]]


def snippet(text: str, rng: random.Random) -> str | None:
    """A window of whole lines of `text` of at most MAX_CODE_CHARS, from a random line; None where
    the file has too little text."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    if sum(len(ln) for ln in lines) < 200:
        return None
    start = rng.randrange(max(1, len(lines) - 8))
    out, size = [], 0
    for ln in lines[start:]:
        if size + len(ln) + 1 > MAX_CODE_CHARS:
            break
        out.append(ln)
        size += len(ln) + 1
    body = "\n".join(out).strip("\n")
    return body if len(body.strip()) >= 150 else None


def code_requests(split: str, seed: int = 0) -> list[dict]:
    """One request per file of `code_files(split)`: a snippet under a template of its kind."""
    rng = random.Random(seed)
    out = []
    for p in code_files(split):
        try:
            body = snippet(read_source(p), rng)
        except OSError:
            continue
        if body is None:
            continue
        lang = LANGUAGES[p.suffix]
        if lang == "C" and any(k in body for k in ("namespace ", "template <", "template<", "::")):
            lang = "C++"  # a header says which by what it holds
        if sum(ln.lstrip().startswith(("#include", "#pragma", "import ")) for ln in body.splitlines()) * 2 > \
                body.count("\n") + 1:
            continue  # mostly includes: nothing to ask about
        kind, template = rng.choice(DOC_TEMPLATES if lang == "Markdown" else CODE_TEMPLATES)
        fence = "" if lang == "Markdown" else lang.lower().replace("c++", "cpp").replace("shell", "sh")
        block = body if lang == "Markdown" else f"```{fence}\n{body}\n```"
        out.append({"id": f"code/{p.name}:{kind}", "kind": f"code-{kind}",
                    "messages": [{"role": "user", "content": template.format(lang=lang, block=block)}]})
    return out


def general_requests() -> list[dict]:
    """Every topic x template question (training only)."""
    return [{"id": f"general/{i}:{j}", "kind": "everyday",
             "messages": [{"role": "user", "content": q.format(t=t)}]}
            for i, t in enumerate(TOPICS) for j, q in enumerate(QUESTION_TEMPLATES)]


def more_general_requests() -> list[dict]:
    """Every topic x `MORE_QUESTION_TEMPLATES` question (training only; the second round's)."""
    return [{"id": f"general2/{i}:{j}", "kind": "everyday",
             "messages": [{"role": "user", "content": q.format(t=t)}]}
            for i, t in enumerate(TOPICS) for j, q in enumerate(MORE_QUESTION_TEMPLATES)]


def second_turn(messages: list[dict], answer: str, follow_up: str) -> list[dict]:
    """`messages` answered with `answer` and followed by the user's `follow_up`."""
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]


def user_requests(seed: int = 0) -> list[dict]:
    """The training half's single-turn requests, shuffled: code in other languages and everyday
    questions (second turns need the target's answers: `second_turn`)."""
    rows = code_requests("train", seed) + general_requests()
    random.Random(seed).shuffle(rows)
    return rows


def heldout_package_requests(seed: int = 1) -> list[dict]:
    """Requests about the documented code of `HELDOUT_PACKAGES` (installed ones), shuffled."""
    root = packages_root()
    rows = []
    for name in HELDOUT_PACKAGES:
        for d, dirs, files in os.walk(root / name):
            dirs[:] = sorted(x for x in dirs if x not in {"tests", "test", "__pycache__"})
            rows += [r for f in sorted(files) if f.endswith(".py") for r in _requests(Path(d) / f, root)]
    random.Random(seed).shuffle(rows)
    return rows


def heldout_user_requests(per_part: int = 8, seed: int = 1) -> tuple[list[dict], list[dict]]:
    """(single-turn chats, first turns to be followed up) of the held-out half: 8 chats each of
    other-language code, held-out packages' Python and everyday questions, then 8 first turns of
    each of everyday questions and code, as {id, kind, messages}."""
    rng = random.Random(seed)
    code = code_requests("heldout", seed)
    rng.shuffle(code)
    python = [r for r in heldout_package_requests(seed) if r["kind"] in ("explain", "edit", "test", "write")]
    questions = [{"id": f"question/{i}", "kind": "everyday", "messages": [{"role": "user", "content": q}]}
                 for i, q in enumerate(HELDOUT_QUESTIONS)]
    single = ([{**r, "kind": "code-other"} for r in code[:per_part]]
              + [{**r, "id": f"heldout-packages/{r['id']}", "kind": "code-python"} for r in python[:per_part]]
              + questions[:per_part * 2])
    firsts = questions[per_part * 2:per_part * 3] + code[per_part:per_part * 2]
    return single, firsts
