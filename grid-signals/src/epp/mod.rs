//! What an operator concludes from its EPP scrapes: readiness, in-flight, latency (issue 5).
