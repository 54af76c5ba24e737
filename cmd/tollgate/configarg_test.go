package main

import "testing"

// TestConfigArg: the config file is FILE or -config FILE; "serve -config
// x.yaml" once looked for a file named -config, and any other flag was
// taken for a file name too.
func TestConfigArg(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	for _, c := range []struct {
		args []string
		want string // "" for an error
	}{
		{nil, "gateway.yaml"},
		{[]string{"x.yaml"}, "x.yaml"},
		{[]string{"-config", "x.yaml"}, "x.yaml"},
		{[]string{"--config", "x.yaml"}, "x.yaml"},
		{[]string{"-config=x.yaml"}, "x.yaml"},
		{[]string{"-config"}, ""},
		{[]string{"-config="}, ""},
		{[]string{"-h"}, ""},
		{[]string{"--port", "1"}, ""},
		{[]string{"a.yaml", "b.yaml"}, ""},
		{[]string{"-config", "a.yaml", "b.yaml"}, ""},
	} {
		got, err := configArg(c.args)
		if c.want == "" && err == nil || c.want != "" && (err != nil || got != c.want) {
			t.Errorf("configArg(%q) = %q, %v; want %q", c.args, got, err, c.want)
		}
	}
}
