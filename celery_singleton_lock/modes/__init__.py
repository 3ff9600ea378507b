"""The lock types, one module each: what a mode does at publish, receipt, start and end."""

from .base import Mode, PublishHold, Start
from .cancel import Cancel, cancel_options
from .debounce import Debounce
from .limit import Limit, Total
from .rate import Rated, RateLimit, RateSpec
from .replace import Replace, Replacement
from .throttle import Throttle
from .until_executed import UntilExecuted
from .until_executing import UntilExecuting
from .while_executing import WhileExecuting

__all__ = [
    "Cancel",
    "Debounce",
    "Limit",
    "Mode",
    "PublishHold",
    "RateLimit",
    "RateSpec",
    "Rated",
    "Replace",
    "Replacement",
    "Start",
    "Throttle",
    "Total",
    "UntilExecuted",
    "UntilExecuting",
    "WhileExecuting",
    "cancel_options",
]
