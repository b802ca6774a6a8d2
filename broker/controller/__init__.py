"""isrlab broker.controller: the sans-IO controller core (elections, ISR cleanup, assignment).

See ``broker.controller.controller`` for the decision rules and
``broker.controller.assignment`` for how new topics are placed on brokers.
"""

from isrlab.broker.controller.assignment import assign_replicas_to_brokers
from isrlab.broker.controller.controller import (
    Controller,
    ControllerAction,
    NotifyBrokers,
    ReadStateZnode,
    WriteAssignmentZnode,
)

__all__ = [
    "Controller",
    "ControllerAction",
    "NotifyBrokers",
    "ReadStateZnode",
    "WriteAssignmentZnode",
    "assign_replicas_to_brokers",
]
