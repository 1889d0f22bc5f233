//! The load store: bounded windows of recent readings per site and provider (issue 4).
