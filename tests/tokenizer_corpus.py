"""Real English text (public-domain passages) for tokenizer tests, so results never depend on random data."""

from __future__ import annotations

GETTYSBURG = """Four score and seven years ago our fathers brought forth on this continent, a new nation, \
conceived in Liberty, and dedicated to the proposition that all men are created equal.

Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived and so \
dedicated, can long endure. We are met on a great battle-field of that war. We have come to dedicate a portion \
of that field, as a final resting place for those who here gave their lives that that nation might live. It is \
altogether fitting and proper that we should do this.

But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- this ground. The \
brave men, living and dead, who struggled here, have consecrated it, far above our poor power to add or detract. \
The world will little note, nor long remember what we say here, but it can never forget what they did here. It \
is for us the living, rather, to be dedicated here to the unfinished work which they who fought here have thus \
far so nobly advanced. It is rather for us to be here dedicated to the great task remaining before us -- that \
from these honored dead we take increased devotion to that cause for which they gave the last full measure of \
devotion -- that we here highly resolve that these dead shall not have died in vain -- that this nation, under \
God, shall have a new birth of freedom -- and that government of the people, by the people, for the people, \
shall not perish from the earth.
"""

AUSTEN = """It is a truth universally acknowledged, that a single man in possession of a good fortune, must be \
in want of a wife.

However little known the feelings or views of such a man may be on his first entering a neighbourhood, this \
truth is so well fixed in the minds of the surrounding families, that he is considered the rightful property of \
some one or other of their daughters.

"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield Park is let at last?"

Mr. Bennet replied that he had not.

"But it is," returned she; "for Mrs. Long has just been here, and she told me all about it."

Mr. Bennet made no answer.

"Do you not want to know who has taken it?" cried his wife impatiently.

"You want to tell me, and I have no objection to hearing it."

This was invitation enough.
"""

DICKENS = """It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of \
foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the \
season of Darkness, it was the spring of hope, it was the winter of despair, we had everything before us, we had \
nothing before us, we were all going direct to Heaven, we were all going direct the other way -- in short, the \
period was so far like the present period, that some of its noisiest authorities insisted on its being received, \
for good or for evil, in the superlative degree of comparison only.

There were a king with a large jaw and a queen with a plain face, on the throne of England; there were a king \
with a large jaw and a queen with a fair face, on the throne of France. In both countries it was clearer than \
crystal to the lords of the State preserves of loaves and fishes, that things in general were settled for ever.
"""

MELVILLE = """Call me Ishmael. Some years ago -- never mind how long precisely -- having little or no money in \
my purse, and nothing particular to interest me on shore, I thought I would sail about a little and see the \
watery part of the world. It is a way I have of driving off the spleen and regulating the circulation. Whenever \
I find myself growing grim about the mouth; whenever it is a damp, drizzly November in my soul; whenever I find \
myself involuntarily pausing before coffin warehouses, and bringing up the rear of every funeral I meet; and \
especially whenever my hypos get such an upper hand of me, that it requires a strong moral principle to prevent \
me from deliberately stepping into the street, and methodically knocking people's hats off -- then, I account it \
high time to get to sea as soon as I can.
"""

CORPUS = "\n".join([GETTYSBURG, AUSTEN, DICKENS, MELVILLE])
CORPUS_LINES = CORPUS.splitlines(keepends=True)

# Text that stresses byte-level BPE: unicode, numbers, contractions, runs of spaces and newlines.
TRICKY = (
    "Caf\u00e9 na\u00efve fa\u00e7ade \u2014 \u00bfQu\u00e9 tal? \u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002 "
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \U0001f917\U0001f389 e\u0301 \u00a0nbsp\n"
    "I'm sure you'll see we've done what they're saying; she'd said it's HE'S and O'Neil's.\n"
    "Numbers: 3.14159, 2,718,281, 1e-9, 0x1F, 12345678901234567890, -42, 50%.\n"
    "    indented    with    four    spaces\n\n\n\ttab\tseparated\tvalues\r\n"
    "trailing spaces   \n   \n"
    "URL https://example.org/path?q=1&r=two#frag and e-mail user@example.com\n"
    "Symbols: <|> {} [] () ~ ` ^ | \\ / * + = _ -- ... !!! ???   end   "
)


def bundled_text() -> str:
    """Several KB of real English: the opening of the bundled corpus's first Austen chapter and a Shakespeare play."""
    from lmforge.data.corpus.bundled import load_default_corpus

    docs = load_default_corpus()
    return docs[0][:6000] + "\n\n" + docs[-1][:6000]
