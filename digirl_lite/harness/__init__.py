"""Improving a frozen agent (issue 30): a harness around it (:mod:`.harness`, its skill rules
in :mod:`.rules`), DarwinX selection over harness variants on GEPA's engine
(:mod:`.darwinx`) and Darwin-Claw experience units (:mod:`.claw`).

Nothing here changes an agent's weights. Import the submodules you use; this package
imports nothing heavy.
"""
