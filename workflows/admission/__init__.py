"""Shared-Host Scheduling and Admission v1: the pure engine and its models.

`model` holds the boundary types (policy, request, record, audit event,
operations, results); `engine` the deterministic state machine; `codec` the
compact form of the engine state carried across continue-as-new.
"""
