package idemgrpc

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idem-go/idem"
)

// How a gRPC answer is kept in an idem.Response, whose shape is HTTP's:
// Status is HTTPStatus of the code (what a store's reader understands),
// Body the response message's deterministic encoding (empty unless the
// code is OK), and Header holds the rest under names no HTTP answer uses:
//
//	Grpc-Status              the code, in decimal: what a replay returns
//	Grpc-Message             the status message, when there is one
//	Grpc-Status-Details-Bin  the whole google.rpc.Status, base64, when it has details
//	Grpc-Header-<name>       kept header metadata (Config.ReplayMetadata)
//	Grpc-Trailer-<name>      kept trailer metadata
//
// Values of binary metadata (names ending in -bin) are kept in base64, as
// they travel, since a store may keep headers as text.
const (
	hdrStatus  = "Grpc-Status"
	hdrMessage = "Grpc-Message"
	hdrDetails = "Grpc-Status-Details-Bin"
	hdrHeader  = "Grpc-Header-"
	hdrTrailer = "Grpc-Trailer-"
)

var deterministic = proto.MarshalOptions{Deterministic: true}

// callStream stands in for the call's grpc.ServerTransportStream while the
// handler runs, so that the metadata it sets can be kept: it records what
// is set and passes everything on.
type callStream struct {
	grpc.ServerTransportStream
	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
}

func (s *callStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	s.header = metadata.Join(s.header, md)
	s.mu.Unlock()
	return s.ServerTransportStream.SetHeader(md)
}

func (s *callStream) SendHeader(md metadata.MD) error {
	s.mu.Lock()
	s.header = metadata.Join(s.header, md)
	s.mu.Unlock()
	return s.ServerTransportStream.SendHeader(md)
}

func (s *callStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	s.trailer = metadata.Join(s.trailer, md)
	s.mu.Unlock()
	return s.ServerTransportStream.SetTrailer(md)
}

// keptAnswer is what the engine keeps of a handler's answer: resp when err
// is nil, err's status otherwise, and the metadata named in ReplayMetadata.
// A response over MaxResponseBytes is kept without its message (overflow:
// the engine decides what that means).
//
// extra is header metadata kept whatever ReplayMetadata says (a settle's
// marker, see CompleterConfig.Settle).
func (i *Interceptor) keptAnswer(resp any, err error, cs *callStream, extra metadata.MD) (kept idem.Response, overflow bool, kerr error) {
	st := status.Convert(err)
	h := http.Header{hdrStatus: {strconv.Itoa(int(st.Code()))}}
	if msg := st.Message(); msg != "" {
		h[hdrMessage] = []string{msg}
	}
	p := st.Proto()
	if len(p.GetDetails()) > 0 {
		b, merr := deterministic.Marshal(p)
		if merr != nil {
			return idem.Response{}, false, merr
		}
		h[hdrDetails] = []string{base64.StdEncoding.EncodeToString(b)}
	}
	if cs != nil && len(i.replayMD) > 0 {
		cs.mu.Lock()
		keepMD(h, hdrHeader, cs.header, i.replayMD)
		keepMD(h, hdrTrailer, cs.trailer, i.replayMD)
		cs.mu.Unlock()
	}
	for name, vals := range extra {
		keepMD(h, hdrHeader, metadata.MD{name: vals}, []string{name})
	}
	kept = idem.Response{Status: HTTPStatus(st.Code()), Header: h}
	if err == nil {
		m, ok := resp.(proto.Message)
		if !ok {
			return idem.Response{}, false, fmt.Errorf("%w: a %T", errNotMessage, resp)
		}
		b, merr := deterministic.Marshal(m)
		if merr != nil {
			return idem.Response{}, false, merr
		}
		if len(b) > i.cfg.MaxResponseBytes {
			if len(i.cfg.BodyKeys) > 0 {
				// Nothing to seal the metadata in: none is kept.
				for name := range h {
					if strings.HasPrefix(name, hdrHeader) || strings.HasPrefix(name, hdrTrailer) {
						delete(h, name)
					}
				}
			}
			return kept, true, nil
		}
		kept.Body = b
	}
	if len(i.cfg.BodyKeys) > 0 || i.cfg.DiscardBodies {
		kept = envelop(kept, len(i.cfg.BodyKeys) > 0)
	}
	return kept, false, nil
}

// hdrEnvelope marks a kept answer whose body is an envelope: with
// Config.BodyKeys or DiscardBodies, what an answer says beyond its code
// (the status message and details, and, with BodyKeys, the replayed
// metadata) is kept in the body with the response message, which the
// engine seals (or drops), rather than in headers, which every store keeps
// in clear.
const hdrEnvelope = "Grpc-Enveloped"

// envelope is the body of an answer marked hdrEnvelope.
type envelope struct {
	Header http.Header `json:"h,omitempty"`
	Body   []byte      `json:"b,omitempty"`
}

// envelop moves kept's headers but its code (and, unless withMD, its
// metadata) into its body.
func envelop(kept idem.Response, withMD bool) idem.Response {
	env := envelope{Header: http.Header{}, Body: kept.Body}
	h := http.Header{hdrEnvelope: {"1"}}
	for name, vals := range kept.Header {
		isMD := strings.HasPrefix(name, hdrHeader) || strings.HasPrefix(name, hdrTrailer)
		if name == hdrStatus || (isMD && !withMD) {
			h[name] = vals
			continue
		}
		env.Header[name] = vals
	}
	b, err := json.Marshal(env)
	if err != nil {
		panic(err) // strings and bytes always encode
	}
	kept.Header, kept.Body = h, b
	return kept
}

// unenvelop reverses envelop; an envelope dropped (DiscardBodies) leaves
// the code alone.
func unenvelop(resp *idem.Response) (*idem.Response, error) {
	if resp.Header.Get(hdrEnvelope) == "" {
		return resp, nil
	}
	out := &idem.Response{Status: resp.Status, Header: resp.Header.Clone(), BodyOmitted: resp.BodyOmitted}
	if len(resp.Body) == 0 {
		return out, nil
	}
	var env envelope
	if err := json.Unmarshal(resp.Body, &env); err != nil {
		return nil, errUnreadable
	}
	for name, vals := range env.Header {
		out.Header[name] = vals
	}
	out.Body = env.Body
	return out, nil
}

func keepMD(h http.Header, prefix string, md metadata.MD, names []string) {
	for _, name := range names {
		vals := md.Get(name)
		if len(vals) == 0 {
			continue
		}
		out := make([]string, len(vals))
		for j, v := range vals {
			if strings.HasSuffix(name, "-bin") {
				v = base64.StdEncoding.EncodeToString([]byte(v))
			}
			out[j] = v
		}
		h[prefix+name] = out
	}
}

// replayed is a kept answer made ready to return again.
type replayed struct {
	code    codes.Code
	err     error       // the status error, unless code is OK
	body    []byte      // the response's encoding, when code is OK
	header  metadata.MD // replayed header metadata, MetadataReplayed included
	trailer metadata.MD
}

// decodeAnswer reads a kept answer back. A Response without Grpc-Status
// was not kept by this package (an HTTP answer kept under the same key and
// fingerprint cannot happen, their fingerprints differ): it is an error.
func decodeAnswer(resp *idem.Response) (*replayed, error) {
	r := &replayed{header: metadata.Pairs(MetadataReplayed, "true"), code: codes.Unknown}
	if resp == nil {
		return nil, errUnreadable
	}
	resp, err := unenvelop(resp)
	if err != nil {
		return nil, err
	}
	found := false
	for name, vals := range resp.Header {
		lower := strings.ToLower(name)
		switch {
		case lower == "grpc-status" && len(vals) == 1:
			n, err := strconv.ParseUint(vals[0], 10, 32)
			if err != nil {
				return nil, errUnreadable
			}
			r.code, found = codes.Code(n), true
		case strings.HasPrefix(lower, "grpc-header-"):
			if err := appendMD(r.header, lower[len("grpc-header-"):], vals); err != nil {
				return nil, err
			}
		case strings.HasPrefix(lower, "grpc-trailer-"):
			if r.trailer == nil {
				r.trailer = metadata.MD{}
			}
			if err := appendMD(r.trailer, lower[len("grpc-trailer-"):], vals); err != nil {
				return nil, err
			}
		}
	}
	if !found {
		return nil, errUnreadable
	}
	if r.code == codes.OK {
		r.body = resp.Body
		if resp.BodyOmitted {
			r.header.Set(MetadataBodyOmitted, "true")
		}
		return r, nil
	}
	if d := resp.Header.Get(hdrDetails); d != "" {
		b, err := base64.StdEncoding.DecodeString(d)
		if err != nil {
			return nil, errUnreadable
		}
		var p spb.Status
		if err := proto.Unmarshal(b, &p); err != nil {
			return nil, errUnreadable
		}
		r.err = status.ErrorProto(&p)
		return r, nil
	}
	r.err = status.Error(r.code, resp.Header.Get(hdrMessage))
	return r, nil
}

func appendMD(md metadata.MD, name string, vals []string) error {
	for _, v := range vals {
		if strings.HasSuffix(name, "-bin") {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				return errUnreadable
			}
			v = string(b)
		}
		md.Append(name, v)
	}
	return nil
}

var errUnreadable = status.Error(codes.Internal, "idemgrpc: the kept answer cannot be read")

// responseTypes finds the message type a method answers with, to replay a
// kept answer as the type the handler returned: first the type its
// handler was seen to return in this process, then the method's
// descriptor in the protobuf registry (every generated package registers
// its own).
type responseTypes struct {
	seen sync.Map // full method -> protoreflect.MessageType
}

func (t *responseTypes) learn(fullMethod string, resp any) {
	if m, ok := resp.(proto.Message); ok {
		if _, ok := t.seen.Load(fullMethod); !ok {
			t.seen.Store(fullMethod, m.ProtoReflect().Type())
		}
	}
}

// message returns a new message of the method's answer, holding body.
// When the type is nowhere to be found (a service described by hand, in a
// process that has not run the method), the body is carried as the
// unknown fields of an empty message: the codec sends those bytes as they
// are, so the client reads the same answer, though an interceptor before
// this one sees an *emptypb.Empty.
func (t *responseTypes) message(fullMethod string, body []byte) (proto.Message, error) {
	var mt protoreflect.MessageType
	if v, ok := t.seen.Load(fullMethod); ok {
		mt = v.(protoreflect.MessageType)
	} else if md := methodDescriptor(fullMethod); md != nil {
		if found, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil {
			mt = found
			t.seen.Store(fullMethod, mt)
		}
	}
	var m proto.Message = &emptypb.Empty{}
	if mt != nil {
		m = mt.New().Interface()
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return nil, errUnreadable
	}
	return m, nil
}

// methodDescriptor returns the registered descriptor of
// "/package.Service/Method", or nil.
func methodDescriptor(fullMethod string) protoreflect.MethodDescriptor {
	svc, method, ok := splitMethod(fullMethod)
	if !ok {
		return nil
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	return sd.Methods().ByName(protoreflect.Name(method))
}

// splitMethod splits "/package.Service/Method" as gRPC's server routes a
// call (grpc-go's handleStream, v1.85.0): the name must begin with a
// slash, the service is what lies between it and the last slash, the
// method what follows the last one. So "/a.B/C/D" is the method D of a
// service "a.B/C", not a method "C/D" of a.B. A name without its leading
// slash, or with an empty service or method, is malformed: not ok.
func splitMethod(fullMethod string) (service, method string, ok bool) {
	rest, found := strings.CutPrefix(fullMethod, "/")
	i := strings.LastIndexByte(rest, '/')
	if !found || i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}
