"""An English stop word list for :func:`pgmflow.tasks.lda.corpus.from_text_folder`.

Written for this project (not copied from another list): function words, pronouns, auxiliary
verbs and their contractions, quantifiers, and very common adverbs and verbs that carry no topic.
All lower case, in the form the tokeniser produces (it keeps inner apostrophes: ``don't``).
"""

from __future__ import annotations

__all__ = ["ENGLISH_STOP_WORDS"]

_WORDS = """
a about above across after afterwards again against ago all almost alone along already also
although always am among amongst an and another any anybody anyhow anyone anything anyway
anywhere are aren't around as aside at away

back be became because become becomes becoming been before beforehand behind being below
beside besides between beyond both but by

can can't cannot could couldn't

did didn't do does doesn't doing don't done down due during

each either else elsewhere enough especially etc even ever every everybody everyone everything
everywhere except

few fewer first for former formerly from further furthermore

get gets getting give given gives go goes going gone got

had hadn't has hasn't have haven't having he he'd he'll he's hence her here here's hereafter
hereby herein hers herself him himself his how how's however

i i'd i'll i'm i've ie if in inc indeed instead into is isn't it it's its itself

just

keep keeps kept

last later latter least less let let's like likely

made make makes making many may maybe me meanwhile might mine more moreover most mostly much
must mustn't my myself

namely near nearly neither never nevertheless next no nobody none noone nor not nothing now
nowhere

of off often on once one ones only onto or other others otherwise ought our ours ourselves out
over overall own

per perhaps please put

quite

rather really

same say says seem seemed seeming seems several shall shan't she she'd she'll she's should
shouldn't since so some somebody somehow someone something sometime sometimes somewhat somewhere
still such

take taken takes than that that's the their theirs them themselves then thence there there's
thereafter thereby therefore therein thereupon these they they'd they'll they're they've this
those though through throughout thru thus to together too toward towards

under unless until up upon us use used uses using usually

very via

was wasn't we we'd we'll we're we've well were weren't what what's whatever when when's whence
whenever where where's whereafter whereas whereby wherein whereupon wherever whether which while
whither who who's whoever whole whom whose why why's will with within without won't would
wouldn't

yet you you'd you'll you're you've your yours yourself yourselves
"""

ENGLISH_STOP_WORDS: frozenset[str] = frozenset(_WORDS.split())
