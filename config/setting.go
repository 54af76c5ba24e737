package config

import (
	"fmt"
	"reflect"
	"strings"
)

// Setting is the value of one setting of cfg, named by its path in
// gateway.yaml ("server.data_dir"), as the gateway uses it: variables
// expanded and defaults filled in. Only single values are printed; a
// section, list or map is refused with the names under it.
func Setting(cfg *Config, path string) (string, error) {
	v := reflect.ValueOf(cfg).Elem()
	walked := ""
	for name := range strings.SplitSeq(path, ".") {
		if v.Kind() != reflect.Struct {
			return "", fmt.Errorf("%s is a single value: it has no %s", walked, name)
		}
		field, ok := fieldByYAMLName(v, name)
		if !ok {
			return "", fmt.Errorf("no setting %s%s: %s holds %s", walked, dotIfAny(walked)+name, orTop(walked), strings.Join(yamlNames(v.Type()), ", "))
		}
		walked += dotIfAny(walked) + name
		v = field
	}
	switch v.Kind() {
	case reflect.Struct, reflect.Slice, reflect.Map, reflect.Pointer, reflect.Interface:
		return "", fmt.Errorf("%s is not a single value: name one of its settings", path)
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String(), nil
	}
	return fmt.Sprint(v.Interface()), nil
}

func dotIfAny(walked string) string {
	if walked == "" {
		return ""
	}
	return "."
}

func orTop(walked string) string {
	if walked == "" {
		return "the file"
	}
	return walked
}

// fieldByYAMLName is v's field that gateway.yaml names name.
func fieldByYAMLName(v reflect.Value, name string) (reflect.Value, bool) {
	t := v.Type()
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == name && t.Field(i).IsExported() {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func yamlNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag != "" && tag != "-" && t.Field(i).IsExported() {
			names = append(names, tag)
		}
	}
	return names
}
