package main

import (
	"sort"

	"github.com/tollgate/tollgate/classifiers"
)

// engines are what -engine can name. Adding one (the semantic engine, or
// an llm engine reading its upstream from environment variables) is one
// line here; a constructor is called once, after the data is loaded, so
// -bench can measure the memory it adds.
var engines = map[string]func() (classifiers.Engine, error){
	classifiers.EngineLexical:  func() (classifiers.Engine, error) { return classifiers.NewLexical(), nil },
	classifiers.EngineLLM:      llmEngineFromEnv,
	classifiers.EngineSemantic: semanticEngine,
}

// defaultEngine is the engine the gateway answers with offline when the
// vectors are installed, so a bare `make eval` measures what users get.
const defaultEngine = classifiers.EngineSemantic

func engineNames() []string {
	names := make([]string, 0, len(engines))
	for n := range engines {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
