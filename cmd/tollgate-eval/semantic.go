package main

import (
	"fmt"
	"os"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
)

// semanticEngine maps the word vectors where the gateway's default config
// finds them: TOLLGATE_VECTORS, else plugins.vectors' default (make eval
// installs them there first).
func semanticEngine() (classifiers.Engine, error) {
	path := os.Getenv("TOLLGATE_VECTORS")
	if path == "" {
		path = config.DefaultVectors
	}
	v, err := classifiers.LoadVectors(path)
	if err != nil {
		return nil, fmt.Errorf("%w (install the vectors with scripts/vectors.sh install)", err)
	}
	return classifiers.NewSemantic(v), nil
}
