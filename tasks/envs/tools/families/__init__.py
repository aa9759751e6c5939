"""Procedural tool families (environments of kind `tools`): one module per domain, `common` shared.

They are registered in `tasks.envs.families.FAMILIES` next to the terminal families."""

from .bookings import Bookings
from .calendar import Calendar
from .orders import Orders
from .tickets import Tickets

FAMILY_CLASSES = (Bookings, Orders, Tickets, Calendar)
