"""advise: the serving flags and environment for this image, this node and this model, from the rule table.

from bwstack.advise import Facts, advise
advice = advise(load_recipe("sglang"), facts)
advice.command(base), advice.env, advice.decisions  # rule | decision | why | source
"""

from bwstack.advise.advisor import Advice, Decision, RuleDecision, advice_report, advise, load_advice
from bwstack.advise.facts import AdviseError, Facts, ImageFacts, ModelFacts, NodeFacts

__all__ = [
    "Advice",
    "AdviseError",
    "Decision",
    "Facts",
    "ImageFacts",
    "ModelFacts",
    "NodeFacts",
    "RuleDecision",
    "advice_report",
    "advise",
    "load_advice",
]
