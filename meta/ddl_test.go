package meta_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/meta"
)

func TestParseDDL(t *testing.T) {
	long := strings.Repeat("a", 128)
	for _, c := range []struct {
		name  string
		value string
		field string // "" means valid
	}{
		{"create", `{"op":"create","flow":{"catalog_name":"c","flow_name":"f","source_table_ids":[1,2]}}`, ""},
		{"create with routes", `{"op":"create","flow":{"flow_name":"f","source_table_ids":[1],"flownode_ids":{"0":7}},"routes":{"0":{"peer":{"id":7,"addr":"h:1"}}},"flow_id":3,"if_not_exists":true}`, ""},
		{"replace", `{"op":"replace","flow":{"flow_name":"f-1_X","source_table_ids":[4294967295]}}`, ""},
		{"drop needs no tables", `{"op":"drop","flow":{"flow_name":"f"}}`, ""},
		{"resume needs no tables", `{"op":"resume","flow":{"catalog_name":"c","flow_name":"f"}}`, ""},
		{"128-char name", `{"op":"drop","flow":{"flow_name":"` + long + `"}}`, ""},
		{"bad json", `{"op":"create",`, "json"},
		{"not an object", `[1]`, "json"},
		{"trailing data", `{"op":"drop","flow":{"flow_name":"f"}} {}`, "json"},
		{"unknown field", `{"op":"drop","flow":{"flow_name":"f"},"extra":1}`, "json"},
		{"wrong type", `{"op":"create","flow":{"flow_name":"f","source_table_ids":["1"]}}`, "json"},
		{"missing op", `{"flow":{"flow_name":"f"}}`, "op"},
		{"unknown op", `{"op":"alter","flow":{"flow_name":"f"}}`, "op"},
		{"empty name", `{"op":"drop","flow":{"flow_name":""}}`, "flow.flow_name"},
		{"dot dot", `{"op":"drop","flow":{"flow_name":".."}}`, "flow.flow_name"},
		{"slash", `{"op":"drop","flow":{"flow_name":"a/b"}}`, "flow.flow_name"},
		{"escaped slash", `{"op":"drop","flow":{"flow_name":"a%2Fb"}}`, "flow.flow_name"},
		{"json escaped slash", `{"op":"drop","flow":{"flow_name":"..\u002fetc"}}`, "flow.flow_name"},
		{"unicode", `{"op":"drop","flow":{"flow_name":"flöw"}}`, "flow.flow_name"},
		{"dot", `{"op":"drop","flow":{"flow_name":"a.b"}}`, "flow.flow_name"},
		{"space", `{"op":"drop","flow":{"flow_name":"a b"}}`, "flow.flow_name"},
		{"newline", `{"op":"drop","flow":{"flow_name":"a\n"}}`, "flow.flow_name"},
		{"129-char name", `{"op":"drop","flow":{"flow_name":"` + long + `a"}}`, "flow.flow_name"},
		{"bad catalog", `{"op":"drop","flow":{"catalog_name":"../x","flow_name":"f"}}`, "flow.catalog_name"},
		{"create without tables", `{"op":"create","flow":{"flow_name":"f"}}`, "flow.source_table_ids"},
		{"replace with empty tables", `{"op":"replace","flow":{"flow_name":"f","source_table_ids":[]}}`, "flow.source_table_ids"},
		{"table zero", `{"op":"create","flow":{"flow_name":"f","source_table_ids":[0]}}`, "flow.source_table_ids"},
		{"table twice", `{"op":"create","flow":{"flow_name":"f","source_table_ids":[5,5]}}`, "flow.source_table_ids"},
		{"table too large", `{"op":"create","flow":{"flow_name":"f","source_table_ids":[4294967296]}}`, "json"},
		{"route key not a number", `{"op":"create","flow":{"flow_name":"f","source_table_ids":[1]},"routes":{"x":{}}}`, "routes"},
		{"route key negative", `{"op":"create","flow":{"flow_name":"f","source_table_ids":[1]},"routes":{"-1":{}}}`, "routes"},
		{"route key leading zero", `{"op":"create","flow":{"flow_name":"f","source_table_ids":[1]},"routes":{"01":{}}}`, "routes"},
		{"route key too large", `{"op":"create","flow":{"flow_name":"f","source_table_ids":[1]},"routes":{"4294967296":{}}}`, "routes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := meta.ParseDDL([]byte(c.value))
			if c.field == "" {
				if err != nil {
					t.Fatalf("ParseDDL: %v", err)
				}
				if d.Flow.CatalogName == "" {
					t.Fatal("catalog not defaulted")
				}
				return
			}
			var ve *meta.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want *ValidationError", err)
			}
			if ve.Field != c.field || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("field = %q (%v), want %q", ve.Field, err, c.field)
			}
		})
	}
}

func TestParseDDLFields(t *testing.T) {
	d, err := meta.ParseDDL([]byte(`{"op":"create","flow":{"flow_name":"f","source_table_ids":[1,2],"comment":"c","options":{"k":"v"}},
		"flow_id":42,"routes":{"3":{"peer":{"id":9,"addr":"n:1"}}},"if_not_exists":true}`))
	if err != nil {
		t.Fatal(err)
	}
	id := meta.FlowID(42)
	want := meta.DDL{
		Op: meta.OpCreate,
		Flow: meta.FlowInfo{CatalogName: meta.DefaultCatalog, FlowName: "f", SourceTableIDs: []uint32{1, 2},
			Comment: "c", Options: map[string]string{"k": "v"}},
		FlowID:      &id,
		Routes:      map[string]meta.Route{"3": {Peer: meta.Peer{ID: 9, Addr: "n:1"}}},
		IfNotExists: true,
	}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("ParseDDL = %+v\nwant %+v", d, want)
	}
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"a": true, "A-z_0": true, strings.Repeat("x", 128): true,
		"": false, "..": false, ".": false, "a/b": false, `a\b`: false, "%2F": false, "é": false, strings.Repeat("x", 129): false,
	} {
		if got := meta.ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, want)
		}
	}
}
