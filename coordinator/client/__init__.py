"""What every Lockstep process uses to talk to the coordinator and its topics: the topics
(``topics``), the state reader and follower that fold them (``state``), the command client
(``commands``), the REST client (``rest``) and the clock (``clock``). It sits above the domain
and the codec and below the worker, the data plane and the CLI, and imports none of them.
"""
