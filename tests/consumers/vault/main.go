// vault-transit: Vault's real transit secrets engine (github.com/hashicorp/vault/builtin/logical/transit,
// the release go.mod pins) behind an HTTP front that answers as Vault's does, for
// tests/attest/test_transit.py. Test tooling only, never part of imagegate.
//
// What runs is the engine itself: its Factory, its paths, its key policies (sdk/helper/keysutil),
// its errors. What is a STAND-IN is the little of Vault's core around it, which does not build
// from the served modules (go.mod says why): the token check (two fixed tokens, no token store),
// the ACL (root may do anything; the read-only token may read transit/keys/* and, as Vault's
// default policy allows, sys/capabilities-self), sys/capabilities-self and sys/health. Each
// stand-in names the Vault file whose behaviour it copies.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-multierror"
	"github.com/hashicorp/go-uuid"
	"github.com/hashicorp/vault/builtin/logical/transit"
	"github.com/hashicorp/vault/sdk/helper/jsonutil"
	"github.com/hashicorp/vault/sdk/logical"
)

// the release whose engine this is: sys/health says it, as Vault's does
const vaultVersion = "1.21.4"

type server struct {
	backend   logical.Backend
	storage   logical.Storage
	mount     string // "transit/"
	rootToken string
	readToken string
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8200", "address to serve on")
	mount := flag.String("mount", "transit", "the engine's mount path")
	root := flag.String("root-token", "", "the token that may do anything (Vault's root token)")
	reader := flag.String("read-token", "", "a token that may only read transit/keys/* (optional)")
	cert := flag.String("tls-cert", "", "PEM certificate: serve HTTPS (with -tls-key)")
	key := flag.String("tls-key", "", "PEM private key of -tls-cert")
	flag.Parse()
	if *root == "" {
		log.Fatal("-root-token is required")
	}

	ctx := context.Background()
	storage := &logical.InmemStorage{}
	// What Vault's core gives a mount (vault/mount.go, vault/dynamic_system_view.go): its storage,
	// a system view with Vault's default lease TTLs (32 days, vault/core.go), a UUID, a logger.
	backendUUID, err := uuid.GenerateUUID()
	if err != nil {
		log.Fatal(err)
	}
	conf := &logical.BackendConfig{
		StorageView: storage,
		Logger:      hclog.New(&hclog.LoggerOptions{Name: "transit", Level: hclog.Warn, Output: os.Stderr}),
		System: &logical.StaticSystemView{
			DefaultLeaseTTLVal: 32 * 24 * time.Hour,
			MaxLeaseTTLVal:     32 * 24 * time.Hour,
			VersionString:      vaultVersion,
		},
		BackendUUID: backendUUID,
		Config:      map[string]string{},
	}
	b, err := transit.Factory(ctx, conf)
	if err != nil {
		log.Fatalf("transit.Factory: %v", err)
	}
	// vault/router.go and vault/mount.go initialize a backend once it is mounted
	if err := b.Initialize(ctx, &logical.InitializationRequest{Storage: storage}); err != nil {
		log.Fatalf("transit initialize: %v", err)
	}
	s := &server{backend: b, storage: storage, mount: strings.Trim(*mount, "/") + "/", rootToken: *root, readToken: *reader}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	// the test waits for this line (or polls sys/health)
	fmt.Printf("vault-transit: serving Vault %s's transit engine at /v1/%s on %s\n", vaultVersion, s.mount, ln.Addr())
	if *cert != "" {
		err = srv.ServeTLS(ln, *cert, *key)
	} else {
		err = srv.Serve(ln)
	}
	log.Fatal(err)
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		logical.RespondError(w, http.StatusNotFound, nil)
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/v1/")
	if path == "sys/health" {
		s.health(w, r)
		return
	}
	req, status, err := buildRequest(r, path)
	if err != nil || status != 0 {
		logical.RespondError(w, status, err)
		return
	}
	ctx := r.Context()
	switch {
	case path == "sys/capabilities-self":
		resp, err := s.capabilitiesSelf(req)
		s.respond(w, req, resp, err, true)
	case strings.HasPrefix(path, s.mount):
		req.Path = strings.TrimPrefix(path, s.mount)
		req.MountPoint = s.mount
		req.MountType = "transit" // vault/router.go: the mount's type
		req.Storage = s.storage
		if err := s.checkToken(req, path, func() error { return s.existenceCheck(ctx, req) }); err != nil {
			s.respond(w, req, nil, err, false)
			return
		}
		resp, err := s.backend.HandleRequest(ctx, req)
		s.respond(w, req, resp, err, false)
	default:
		if err := s.checkToken(req, path, nil); err != nil {
			s.respond(w, req, nil, err, false)
			return
		}
		// vault/router.go: a path no mount serves
		s.respond(w, req, nil, fmt.Errorf("no handler for route %q. route entry not found.: %w", path, logical.ErrUnsupportedPath), false)
	}
}

// buildRequest maps the HTTP request onto a logical.Request as buildLogicalRequestNoAuth and
// requestAuth do (http/logical.go, http/handler.go of Vault 1.21.4): GET reads (list=true lists),
// POST and PUT update, DELETE deletes, LIST lists; a JSON body is the request's data. (Form
// bodies, PATCH and response wrapping are not served: imagegate sends none.)
func buildRequest(r *http.Request, path string) (*logical.Request, int, error) {
	var op logical.Operation
	var data map[string]interface{}
	switch r.Method {
	case http.MethodGet:
		op = logical.ReadOperation
		q := r.URL.Query()
		if l := q.Get("list"); l != "" {
			list, err := strconv.ParseBool(l)
			if err != nil {
				return nil, http.StatusBadRequest, nil
			}
			if list {
				q.Del("list")
				op = logical.ListOperation
				if !strings.HasSuffix(path, "/") {
					path += "/"
				}
			}
		}
		data = parseQuery(q)
	case http.MethodPost, http.MethodPut:
		op = logical.UpdateOperation
		// http/logical.go parseJSONRequest: jsonutil.DecodeJSONFromReader; an empty body is no data
		if err := jsonutil.DecodeJSONFromReader(io.LimitReader(r.Body, 32<<20), &data); err != nil {
			if errors.Is(err, io.EOF) {
				data = nil
			} else {
				return nil, http.StatusBadRequest, fmt.Errorf("error parsing JSON: %w", err)
			}
		}
	case http.MethodDelete:
		op = logical.DeleteOperation
		data = parseQuery(r.URL.Query())
	case "LIST":
		op = logical.ListOperation
		if !strings.HasSuffix(path, "/") {
			path += "/"
		}
		data = parseQuery(r.URL.Query())
	default:
		return nil, http.StatusMethodNotAllowed, nil
	}
	id, err := uuid.GenerateUUID()
	if err != nil {
		return nil, http.StatusInternalServerError, err
	}
	req := &logical.Request{
		ID:         id,
		Operation:  op,
		Path:       path,
		Data:       data,
		Connection: &logical.Connection{RemoteAddr: r.RemoteAddr},
		Headers:    r.Header,
	}
	// http/handler.go getTokenFromReq: X-Vault-Token, else "Authorization: Bearer"
	if t := r.Header.Get("X-Vault-Token"); t != "" {
		req.ClientToken = t
	} else if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		req.ClientToken = strings.TrimSpace(strings.TrimPrefix(a, "Bearer "))
	}
	return req, 0, nil
}

// http/logical.go parseQuery: each parameter's first value
func parseQuery(values map[string][]string) map[string]interface{} {
	data := map[string]interface{}{}
	for k, v := range values {
		if len(v) > 0 {
			data[k] = v[0]
		}
	}
	if len(data) == 0 {
		return nil
	}
	return data
}

// existenceCheck: vault/request_handling.go existenceCheck: a write to a path whose backend
// checks existence is a create when the resource is absent, else an update.
func (s *server) existenceCheck(ctx context.Context, req *logical.Request) error {
	if req.Operation != logical.UpdateOperation && req.Operation != logical.CreateOperation {
		return nil
	}
	checkFound, exists, err := s.backend.HandleExistenceCheck(ctx, req)
	switch {
	case errors.Is(err, logical.ErrUnsupportedPath):
		checkFound = false
	case err != nil:
		return err
	}
	if checkFound && !exists {
		req.Operation = logical.CreateOperation
	} else {
		req.Operation = logical.UpdateOperation
	}
	return nil
}

// checkToken: STAND-IN for vault/request_handling.go CheckToken and the token store. Its errors
// are Vault's, and so are their shapes (an unknown token: permission denied and invalid token,
// multierror.Append in fetchACLTokenEntryAndEntity; a policy that denies: permission denied
// appended to the request's errors). Between the two, as there, a write's existence check
// (`existence`) makes it a create or an update, which the policy then judges.
func (s *server) checkToken(req *logical.Request, path string, existence func() error) error {
	switch {
	case req.ClientToken == "":
		return multierror.Append(nil, logical.ErrPermissionDenied)
	case req.ClientToken != s.rootToken && (s.readToken == "" || req.ClientToken != s.readToken):
		return multierror.Append(logical.ErrPermissionDenied, logical.ErrInvalidToken)
	}
	if existence != nil {
		if err := existence(); err != nil {
			return err
		}
	}
	if !allowed(s.capabilities(req.ClientToken, path), req.Operation) {
		return multierror.Append(nil, logical.ErrPermissionDenied)
	}
	return nil
}

// capabilities: STAND-IN for the ACL (vault/acl.go): the root token's are ["root"]; the read-only
// token has Vault's default policy's update on sys/capabilities-self (vault/policy_store.go) and
// `path "MOUNT/keys/*" { capabilities = ["read"] }`; anything else is ["deny"].
func (s *server) capabilities(token, path string) []string {
	switch {
	case token == s.rootToken:
		return []string{"root"}
	case token == s.readToken && path == "sys/capabilities-self":
		return []string{"update"}
	case token == s.readToken && strings.HasPrefix(path, s.mount+"keys/") && len(path) > len(s.mount+"keys/"):
		return []string{"read"}
	}
	return []string{"deny"}
}

// vault/acl.go: root may do anything; else the operation's own capability
func allowed(caps []string, op logical.Operation) bool {
	for _, c := range caps {
		if c == "root" || c == string(op) {
			return true
		}
	}
	return false
}

// capabilitiesSelf: STAND-IN for vault/logical_system.go handleCapabilities (sys/capabilities-self):
// the token's capabilities on each of `paths` (or the deprecated `path`), keyed by path, and
// "capabilities" too when one path was asked.
func (s *server) capabilitiesSelf(req *logical.Request) (*logical.Response, error) {
	if req.Operation != logical.UpdateOperation {
		return nil, logical.ErrUnsupportedOperation
	}
	if err := s.checkToken(req, "sys/capabilities-self", nil); err != nil {
		return nil, err
	}
	paths := stringList(req.Data["paths"])
	if len(paths) == 0 {
		paths = stringList(req.Data["path"])
	}
	if len(paths) == 0 {
		return logical.ErrorResponse("paths must be supplied"), nil
	}
	ret := &logical.Response{Data: map[string]interface{}{}}
	for _, p := range paths {
		ret.Data[p] = s.capabilities(req.ClientToken, strings.TrimPrefix(p, "/"))
	}
	if len(paths) == 1 {
		ret.Data["capabilities"] = ret.Data[paths[0]]
	}
	return ret, nil
}

// framework.TypeCommaStringSlice, as the sys path's field reads it: a list or a comma-separated string
func stringList(v interface{}) []string {
	var out []string
	switch t := v.(type) {
	case string:
		for _, p := range strings.Split(t, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	case []interface{}:
		for _, e := range t {
			if p, ok := e.(string); ok {
				out = append(out, p)
			}
		}
	}
	return out
}

// respond: http/handler.go respondErrorCommon and http/logical.go respondLogical: errors as
// {"errors": [...]} with the status logical.RespondErrorCommon gives (403 permission denied, 400
// invalid request, 404 unsupported path or a read of nothing, ...); else the response envelope
// {"request_id", "data", ...}, 204 when there is none. `inject`: the sys paths whose data Vault
// also puts at the top level (http/handler.go injectDataIntoTopRoutes).
func (s *server) respond(w http.ResponseWriter, req *logical.Request, resp *logical.Response, err error, inject bool) {
	if status, newErr := logical.RespondErrorCommon(req, resp, err); newErr != nil || status != 0 {
		if resp != nil {
			if data := resp.Data["data"]; data != nil {
				logical.RespondErrorAndData(w, status, data, newErr)
				return
			}
		}
		logical.RespondError(w, status, newErr)
		return
	}
	var body interface{}
	if resp != nil {
		httpResp := logical.LogicalResponseToHTTPResponse(resp)
		httpResp.RequestID = req.ID
		body = httpResp
		if inject {
			body = logical.HTTPSysInjector{Response: httpResp}
		}
	}
	// http/handler.go respondOk
	w.Header().Set("Content-Type", "application/json")
	if body == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(body)
}

// health: STAND-IN for http/sys_health.go: an initialized, unsealed, active node (200), its
// HealthResponse's fields.
func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		logical.RespondError(w, http.StatusMethodNotAllowed, nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]interface{}{
		"initialized":                       true,
		"sealed":                            false,
		"standby":                           false,
		"performance_standby":               false,
		"replication_performance_mode":      "disabled",
		"replication_dr_mode":               "disabled",
		"server_time_utc":                   time.Now().Unix(),
		"version":                           vaultVersion,
		"enterprise":                        false,
		"echo_duration_ms":                  0,
		"clock_skew_ms":                     0,
		"replication_primary_canary_age_ms": 0,
	})
}
