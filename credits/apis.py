"""REST endpoint for a user's credits: balance and paginated entries."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.openapi import error_responses
from core.pagination import LimitOffsetPagination, page_parameters
from credits import selectors


class CreditEntrySerializer(serializers.Serializer):
    order_id = serializers.IntegerField()
    total = serializers.IntegerField(source="amount")  # the API keeps the name docs/CONTRACT.md gives
    created_at = serializers.DateTimeField()


class CreditsApi(APIView):
    class CreditsOutputSerializer(serializers.Serializer):
        balance = serializers.IntegerField()
        count = serializers.IntegerField()
        next = serializers.URLField(allow_null=True)
        previous = serializers.URLField(allow_null=True)
        entries = CreditEntrySerializer(many=True)

    @extend_schema(
        parameters=page_parameters("entries"),
        responses={200: CreditsOutputSerializer, **error_responses(400, 401)},
    )
    def get(self, request):
        paginator = LimitOffsetPagination()
        page = paginator.paginate_queryset(selectors.credit_entries(user_id=request.user.pk), request, view=self)
        return Response(
            {
                "balance": selectors.credit_balance(user_id=request.user.pk),
                "count": paginator.count,
                "next": paginator.get_next_link(),
                "previous": paginator.get_previous_link(),
                "entries": CreditEntrySerializer(page, many=True).data,
            }
        )
