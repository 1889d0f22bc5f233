//go:build tools

// The commands this module builds, so go mod tidy keeps their dependencies.
package tools

import (
	_ "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"
	_ "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"
)
