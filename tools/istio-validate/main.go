// istio-validate checks Istio resources written as YAML with Istio's own
// code, at the version the project pins: each document is decoded into its
// proto strictly (an unknown field is an error) and run through the
// validation istiod's webhook and `istioctl validate` apply
// (istio.io/istio/pkg/config/validation, through the Pilot schemas); with
// -crd, it is also checked against the CRD's OpenAPI schema and CEL rules
// (istio.io/istio/pkg/config/crd), as the API server would.
//
// It exists so that the tests check the WasmPlugin the project ships against
// Istio's rules, not against a reimplementation of them.
//
//	istio-validate [-crd CRD_YAML]... FILE...
//
// For every document of every file it prints one JSON object a line:
// {"file": F, "kind": K, "name": N, "errors": [...], "warnings": [...]}.
// Istio's own log lines go to stderr (a package of the module may log one
// to stdout while it initialises, before main runs).
// A kind Istio's Pilot schemas do not know is reported as an error. It exits
// 1 when any document has an error, 2 on bad usage or unreadable input.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/crd"
	"istio.io/istio/pkg/config/schema/collections"
	"istio.io/istio/pkg/log"
	"istio.io/istio/pkg/test/util/yml"
)

type result struct {
	File     string   `json:"file"`
	Kind     string   `json:"kind"`
	Name     string   `json:"name"`
	Errors   []string `json:"errors"`
	Warnings []string `json:"warnings"`
}

type crdFiles []string

func (c *crdFiles) String() string     { return strings.Join(*c, ",") }
func (c *crdFiles) Set(v string) error { *c = append(*c, v); return nil }

func main() {
	var crds crdFiles
	flag.Var(&crds, "crd", "a file of CustomResourceDefinitions to check the documents' schema against (repeatable)")
	flag.Parse()
	logOpts := log.DefaultOptions()
	logOpts.OutputPaths = []string{"stderr"}
	if err := log.Configure(logOpts); err != nil {
		fmt.Fprintln(os.Stderr, "istio-validate:", err)
		os.Exit(2)
	}
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: istio-validate [-crd CRD_YAML]... FILE...")
		os.Exit(2)
	}
	var schemaCheck *crd.Validator
	if len(crds) > 0 {
		v, err := crd.NewValidatorFromFiles(crds...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "istio-validate:", err)
			os.Exit(2)
		}
		schemaCheck = v
	}
	failed := false
	out := json.NewEncoder(os.Stdout)
	for _, file := range flag.Args() {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "istio-validate:", err)
			os.Exit(2)
		}
		for _, doc := range yml.SplitString(string(data)) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			r := check(file, doc, schemaCheck)
			if len(r.Errors) > 0 {
				failed = true
			}
			if err := out.Encode(r); err != nil {
				fmt.Fprintln(os.Stderr, "istio-validate:", err)
				os.Exit(2)
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}

func check(file, doc string, schemaCheck *crd.Validator) result {
	r := result{File: file, Errors: []string{}, Warnings: []string{}}
	un := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &un.Object); err != nil {
		r.Errors = append(r.Errors, fmt.Sprintf("not a YAML object: %v", err))
		return r
	}
	r.Kind, r.Name = un.GetKind(), un.GetName()
	gvk := un.GroupVersionKind()
	schema, known := collections.Pilot.FindByGroupVersionAliasesKind(config.GroupVersionKind{
		Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind,
	})
	if !known {
		r.Errors = append(r.Errors, fmt.Sprintf("%s is not an Istio kind", gvk))
		return r
	}
	if schemaCheck != nil {
		if err := schemaCheck.ValidateCustomResource(un.DeepCopy()); err != nil {
			r.Errors = append(r.Errors, "schema: "+err.Error())
		}
	}
	spec, err := json.Marshal(un.Object["spec"])
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return r
	}
	msg, err := schema.NewInstance()
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return r
	}
	if err := config.ApplyJSONStrict(msg, string(spec)); err != nil {
		r.Errors = append(r.Errors, fmt.Sprintf("spec: %v", err))
		return r
	}
	namespace := un.GetNamespace()
	if namespace == "" {
		namespace = "default"
	}
	warnings, err := schema.ValidateConfig(config.Config{
		Meta: config.Meta{
			GroupVersionKind: schema.GroupVersionKind(),
			Name:             un.GetName(),
			Namespace:        namespace,
			Labels:           un.GetLabels(),
			Annotations:      un.GetAnnotations(),
		},
		Spec: msg,
	})
	if err != nil {
		r.Errors = append(r.Errors, unwrap(err)...)
	}
	if warnings != nil {
		r.Warnings = append(r.Warnings, unwrap(warnings)...)
	}
	return r
}

// unwrap splits Istio's multierror into its messages, one per rule broken.
func unwrap(err error) []string {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range joined.Unwrap() {
			out = append(out, unwrap(e)...)
		}
		return out
	}
	if multi, ok := err.(interface{ WrappedErrors() []error }); ok {
		var out []string
		for _, e := range multi.WrappedErrors() {
			out = append(out, unwrap(e)...)
		}
		return out
	}
	return []string{err.Error()}
}
