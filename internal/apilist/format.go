package main

import (
	"fmt"
	"go/constant"
	"go/token"
	"go/types"
	"slices"
	"strings"
)

// apiLines returns the lines describing pkg's exported API, sorted and each
// once.
func apiLines(pkg *types.Package) []string {
	l := &lister{pkg: pkg}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		switch obj := scope.Lookup(name).(type) {
		case *types.Const:
			if obj.Exported() {
				l.emit("const %s %s", name, l.typeString(obj.Type()))
				l.emit("const %s = %s", name, constValue(obj.Val()))
			}
		case *types.Var:
			if obj.Exported() {
				l.emit("var %s %s", name, l.typeString(obj.Type()))
			}
		case *types.Func:
			if obj.Exported() {
				l.emit("func %s%s", name, l.signature(obj.Signature()))
			}
		case *types.TypeName:
			if obj.Exported() {
				l.typeName(obj)
			}
		}
	}
	slices.Sort(l.lines)
	return slices.Compact(l.lines)
}

// A lister collects the lines of one package.
type lister struct {
	pkg   *types.Package
	lines []string
}

func (l *lister) emit(format string, args ...any) {
	l.lines = append(l.lines, "pkg "+l.pkg.Path()+", "+fmt.Sprintf(format, args...))
}

// typeName lists a declared type: its definition, its exported fields or
// interface methods, and its exported methods.
func (l *lister) typeName(obj *types.TypeName) {
	if obj.IsAlias() {
		var tparams string
		rhs := obj.Type()
		if a, ok := rhs.(*types.Alias); ok {
			tparams = l.typeParams(a.TypeParams())
			rhs = a.Rhs()
		}
		l.emit("type %s%s = %s", obj.Name(), tparams, l.typeString(rhs))
		return
	}
	named, ok := obj.Type().(*types.Named)
	if !ok {
		return
	}
	decl := "type " + obj.Name() + l.typeParams(named.TypeParams())
	switch u := named.Underlying().(type) {
	case *types.Struct:
		l.structType(decl, u)
	case *types.Interface:
		l.interfaceType(decl, u)
	default:
		l.emit("%s %s", decl, l.typeString(u))
	}
	for m := range named.Methods() {
		if m.Exported() {
			sig := m.Signature()
			l.emit("method (%s) %s%s", l.typeString(sig.Recv().Type()), m.Name(), l.signature(sig))
		}
	}
}

func (l *lister) structType(decl string, s *types.Struct) {
	l.emit("%s struct", decl)
	for f := range s.Fields() {
		switch {
		case !f.Exported():
		case f.Embedded():
			l.emit("%s struct, embedded %s", decl, l.typeString(f.Type()))
		default:
			l.emit("%s struct, %s %s", decl, f.Name(), l.typeString(f.Type()))
		}
	}
}

func (l *lister) interfaceType(decl string, iface *types.Interface) {
	var names []string
	unexported := false
	// Methods gives the whole method set, embedded interfaces' methods
	// too, so moving a method into an embedded interface changes nothing.
	for m := range iface.Methods() {
		if !m.Exported() {
			unexported = true
			continue
		}
		names = append(names, m.Name())
		l.emit("%s interface, %s%s", decl, m.Name(), l.signature(m.Signature()))
	}
	// An unexported method means only this package can implement the
	// interface, which other packages rely on.
	if unexported {
		l.emit("%s interface, unexported methods", decl)
	}
	// What else a constraint allows (type terms, comparable) is API too;
	// embedded interfaces of methods alone are covered by the method lines.
	terms := false
	for t := range iface.EmbeddedTypes() {
		if e, ok := t.Underlying().(*types.Interface); ok && e.IsMethodSet() {
			continue
		}
		terms = true
		l.emit("%s interface, %s", decl, l.typeString(t))
	}
	switch {
	case len(names) > 0:
		slices.Sort(names)
		l.emit("%s interface { %s }", decl, strings.Join(names, ", "))
	case !terms:
		l.emit("%s interface {}", decl)
	}
}

// constValue writes a constant's value exactly: strings in full and
// quoted, and a float in its short form, followed by the exact fraction
// when the short form rounds it (so that a change in the seventh digit
// shows).
func constValue(v constant.Value) string {
	switch v.Kind() {
	case constant.Float:
		s := v.String()
		if constant.Compare(constant.MakeFromLiteral(s, token.FLOAT, 0), token.EQL, v) {
			return s
		}
		return s + " // " + v.ExactString()
	case constant.Complex:
		return v.String()
	default:
		return v.ExactString()
	}
}

func (l *lister) typeString(t types.Type) string {
	var b strings.Builder
	l.writeType(&b, t)
	return b.String()
}

// signature writes a function's type parameters, parameters and results,
// without their names: renaming a parameter does not change the API.
func (l *lister) signature(sig *types.Signature) string {
	var b strings.Builder
	l.writeSignature(&b, sig)
	return b.String()
}

func (l *lister) writeSignature(b *strings.Builder, sig *types.Signature) {
	b.WriteString(l.typeParams(sig.TypeParams()))
	b.WriteByte('(')
	params := sig.Params()
	for i := range params.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		t := params.At(i).Type()
		if sig.Variadic() && i == params.Len()-1 {
			b.WriteString("...")
			if s, ok := t.(*types.Slice); ok {
				t = s.Elem()
			}
		}
		l.writeType(b, t)
	}
	b.WriteByte(')')
	results := sig.Results()
	switch results.Len() {
	case 0:
	case 1:
		b.WriteByte(' ')
		l.writeType(b, results.At(0).Type())
	default:
		b.WriteString(" (")
		for i := range results.Len() {
			if i > 0 {
				b.WriteString(", ")
			}
			l.writeType(b, results.At(i).Type())
		}
		b.WriteByte(')')
	}
}

// typeParams writes a type parameter list, numbering the parameters: their
// names are no part of the API.
func (l *lister) typeParams(list *types.TypeParamList) string {
	if list.Len() == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('[')
	for i := range list.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		tp := list.At(i)
		fmt.Fprintf(&b, "$%d ", tp.Index())
		l.writeType(&b, tp.Constraint())
	}
	b.WriteByte(']')
	return b.String()
}

func (l *lister) writeType(b *strings.Builder, t types.Type) {
	switch t := t.(type) {
	case *types.Basic:
		b.WriteString(basicName(t))
	case *types.Pointer:
		b.WriteByte('*')
		l.writeType(b, t.Elem())
	case *types.Slice:
		b.WriteString("[]")
		l.writeType(b, t.Elem())
	case *types.Array:
		fmt.Fprintf(b, "[%d]", t.Len())
		l.writeType(b, t.Elem())
	case *types.Map:
		b.WriteString("map[")
		l.writeType(b, t.Key())
		b.WriteByte(']')
		l.writeType(b, t.Elem())
	case *types.Chan:
		l.writeChan(b, t)
	case *types.Signature:
		b.WriteString("func")
		l.writeSignature(b, t)
	case *types.Struct:
		l.writeStruct(b, t)
	case *types.Interface:
		l.writeInterface(b, t)
	case *types.Union:
		for i := range t.Len() {
			if i > 0 {
				b.WriteString(" | ")
			}
			term := t.Term(i)
			if term.Tilde() {
				b.WriteByte('~')
			}
			l.writeType(b, term.Type())
		}
	case *types.Named:
		l.writeName(b, t.Obj(), t.TypeArgs())
	case *types.Alias:
		l.writeName(b, t.Obj(), t.TypeArgs())
	case *types.TypeParam:
		fmt.Fprintf(b, "$%d", t.Index())
	default:
		// Tuples appear only inside signatures, written above; anything
		// newer than this code is written as go/types writes it.
		b.WriteString(types.TypeString(t, l.qualify))
	}
}

func (l *lister) writeChan(b *strings.Builder, t *types.Chan) {
	paren := false
	switch t.Dir() {
	case types.SendRecv:
		b.WriteString("chan ")
		// chan (<-chan int) is not chan<- chan int.
		if e, ok := t.Elem().(*types.Chan); ok && e.Dir() == types.RecvOnly {
			paren = true
		}
	case types.SendOnly:
		b.WriteString("chan<- ")
	case types.RecvOnly:
		b.WriteString("<-chan ")
	}
	if paren {
		b.WriteByte('(')
	}
	l.writeType(b, t.Elem())
	if paren {
		b.WriteByte(')')
	}
}

// writeStruct writes a struct type that has no name. Its unexported fields
// are written too: they decide which values it can be assigned.
func (l *lister) writeStruct(b *strings.Builder, s *types.Struct) {
	if s.NumFields() == 0 {
		b.WriteString("struct{}")
		return
	}
	b.WriteString("struct{ ")
	for i := range s.NumFields() {
		if i > 0 {
			b.WriteString("; ")
		}
		f := s.Field(i)
		if !f.Embedded() {
			b.WriteString(f.Name())
			b.WriteByte(' ')
		}
		l.writeType(b, f.Type())
	}
	b.WriteString(" }")
}

// writeInterface writes an interface type that has no name, as declared.
// A constraint written without interface{}, as in [T ~int], is written so.
func (l *lister) writeInterface(b *strings.Builder, iface *types.Interface) {
	if iface.IsImplicit() && iface.NumEmbeddeds() == 1 {
		l.writeType(b, iface.EmbeddedType(0))
		return
	}
	var parts []string
	for m := range iface.ExplicitMethods() {
		parts = append(parts, m.Name()+l.signature(m.Signature()))
	}
	for t := range iface.EmbeddedTypes() {
		parts = append(parts, l.typeString(t))
	}
	if len(parts) == 0 {
		b.WriteString("interface{}")
		return
	}
	b.WriteString("interface{ " + strings.Join(parts, "; ") + " }")
}

// writeName writes a named type or alias, qualified by its package's name
// unless it is in the package being listed, with its type arguments.
func (l *lister) writeName(b *strings.Builder, obj *types.TypeName, args *types.TypeList) {
	if q := l.qualify(obj.Pkg()); q != "" {
		b.WriteString(q)
		b.WriteByte('.')
	}
	b.WriteString(obj.Name())
	if args.Len() > 0 {
		b.WriteByte('[')
		for i := range args.Len() {
			if i > 0 {
				b.WriteString(", ")
			}
			l.writeType(b, args.At(i))
		}
		b.WriteByte(']')
	}
}

// qualify names another package by its name, as code that imports it
// would, and the listed package not at all. A path would be exact, but
// lines stay short and read like Go; the pkg line says where each one is.
func (l *lister) qualify(p *types.Package) string {
	if p == nil || p.Path() == l.pkg.Path() {
		return ""
	}
	return p.Name()
}

// basicName names a basic type. byte and rune are the same types as uint8
// and int32, so each is written one way, and writing []byte as []uint8
// is no change. Untyped constants' types are written as in the Go
// project's api files.
func basicName(t *types.Basic) string {
	switch t.Kind() {
	case types.UntypedBool:
		return "ideal-bool"
	case types.UntypedInt:
		return "ideal-int"
	case types.UntypedRune:
		return "ideal-rune"
	case types.UntypedFloat:
		return "ideal-float"
	case types.UntypedComplex:
		return "ideal-complex"
	case types.UntypedString:
		return "ideal-string"
	case types.UntypedNil:
		return "nil"
	case types.UnsafePointer:
		return "unsafe.Pointer"
	case types.Invalid:
		return "invalid type"
	}
	return types.Typ[t.Kind()].Name()
}
